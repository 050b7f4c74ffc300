set terminal pngcairo size 900,560 enhanced font 'sans,10'
set output "validation_idle.png"
set title "SIMULATED vs measured: idle fraction of the 4-worker runs (x: 0=asp, 1=asp_straggler, 2=bsp, 3=bsp_straggler, 4=ssp1, 5=ssp16, 6=ssp16_straggler, 7=ssp1_straggler, 8=ssp4, 9=ssp4_straggler)" noenhanced
set xlabel "configuration (index)"
set ylabel "idle fraction (mean over seeds, 95% interval)"
set grid
set key top right noenhanced
set yrange [0:1]
$d0 << EOD
-0.1 0.3467 0.34 0.3534
0.9 0.289 0.2784 0.2996
1.9 0.5898 0.5828 0.5968
2.9 0.6324 0.6227999999999999 0.642
3.9 0.5015 0.49249999999999994 0.5105
4.9 0.4515 0.4383 0.4647
5.9 0.542 0.5394 0.5446000000000001
6.9 0.5927 0.5883 0.5971
7.9 0.4599 0.4486 0.47119999999999995
8.9 0.5408 0.5341999999999999 0.5474
EOD
$d1 << EOD
0.1 0.3467 0.3328 0.36060000000000003
1.1 0.3465 0.3354 0.3576
2.1 0.5773 0.5558000000000001 0.5988
3.1 0.5763 0.5627000000000001 0.5899
4.1 0.4809 0.4694 0.4924
5.1 0.4531 0.4365 0.4697
6.1 0.5176 0.5062 0.5289999999999999
7.1 0.5607 0.5549999999999999 0.5664
8.1 0.4407 0.42719999999999997 0.4542
9.1 0.528 0.507 0.549
EOD
plot $d0 using 1:2:3:4 with yerrorbars lw 2 pt 7 ps 0.8 lc 1 title "measured", \
     $d1 using 1:2:3:4 with yerrorbars lw 2 pt 7 ps 0.8 lc 2 title "simulated (SIMULATED)"
