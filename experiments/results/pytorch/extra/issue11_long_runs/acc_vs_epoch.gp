set terminal pngcairo size 900,560 enhanced font 'sans,10'
set output "acc_vs_epoch.png"
set title "PyTorch workers through asyncps: 2 shards x 4 workers, SSP s=2" noenhanced
set xlabel "epoch (per worker)"
set ylabel "test accuracy (rank 0)"
set grid
set key bottom right noenhanced
set yrange [0.75:0.95]
$d0 << EOD
1.004 0.8475
2.004 0.8586
3.004 0.8816
4.004 0.881
5.004 0.9048
6.004 0.9076
7.004 0.9104
8.004 0.9121
9.004 0.92
10.004 0.9181
11.004 0.9212
12.004 0.9241
13.004 0.9227
14.004 0.9239
15.0 0.9228
EOD
$d1 << EOD
1.004 0.8288
2.004 0.8805
3.004 0.8759
4.004 0.9009
5.004 0.9053
6.004 0.9138
7.004 0.9142
8.004 0.919
9.004 0.9193
10.004 0.9222
11.004 0.9267
12.004 0.9283
13.004 0.927
14.004 0.9286
15.0 0.9288
EOD
$d2 << EOD
0.502 0.8212
1.0 0.8374
1.498 0.8549
1.996 0.8532
2.494 0.8629
2.991 0.8445
3.489 0.8636
3.987 0.8703
4.485 0.8743
4.983 0.8757
5.0 0.8781
EOD
$d3 << EOD
0.502 0.8058
1.0 0.7679
1.498 0.8462
1.996 0.8545
2.494 0.8518
2.991 0.8656
3.489 0.868
3.987 0.8679
4.485 0.8697
4.983 0.8726
5.0 0.8745
EOD
plot $d0 using 1:2 with linespoints pt 7 ps 0.6 lw 2 title "cnn_none", \
     $d1 using 1:2 with linespoints pt 7 ps 0.6 lw 2 title "cnn_topk", \
     $d2 using 1:2 with linespoints pt 7 ps 0.6 lw 2 title "mlp_ps_worker", \
     $d3 using 1:2 with linespoints pt 7 ps 0.6 lw 2 title "mlp_pytorch"
