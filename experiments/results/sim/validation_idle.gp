set terminal pngcairo size 900,560 enhanced font 'sans,10'
set output "validation_idle.png"
set title "SIMULATED vs measured: idle fraction of the 4-worker runs (x: 0=asp, 1=asp_straggler, 2=bsp, 3=bsp_straggler, 4=ssp1, 5=ssp16, 6=ssp16_straggler, 7=ssp1_straggler, 8=ssp4, 9=ssp4_straggler)" noenhanced
set xlabel "configuration (index)"
set ylabel "idle fraction (mean over seeds, 95% interval)"
set grid
set key top right noenhanced
set yrange [0:1]
$d0 << EOD
-0.1 0.3682 0.32170000000000004 0.4147
0.9 0.2989 0.2768 0.321
1.9 0.5765 0.48450000000000004 0.6685
2.9 0.6329 0.6281 0.6377
3.9 0.5061 0.4925 0.5196999999999999
4.9 0.4611 0.4084 0.5138
5.9 0.5562 0.532 0.5804
6.9 0.5856 0.5453 0.6259
7.9 0.4879 0.4858 0.49
8.9 0.5657 0.5072 0.6242
EOD
$d1 << EOD
0.1 0.3685 0.3346 0.4024
1.1 0.3027 0.24410000000000004 0.3613
2.1 0.5757 0.4857 0.6657
3.1 0.591 0.5700999999999999 0.6119
4.1 0.4805 0.4542 0.5068
5.1 0.4337 0.3848 0.4826
6.1 0.5077 0.4822 0.5332
7.1 0.5503 0.5256000000000001 0.575
8.1 0.4503 0.421 0.47959999999999997
9.1 0.5046 0.4655 0.5437000000000001
EOD
plot $d0 using 1:2:3:4 with yerrorbars lw 2 pt 7 ps 0.8 lc 1 title "measured", \
     $d1 using 1:2:3:4 with yerrorbars lw 2 pt 7 ps 0.8 lc 2 title "simulated (SIMULATED)"
