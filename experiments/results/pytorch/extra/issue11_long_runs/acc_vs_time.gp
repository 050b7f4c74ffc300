set terminal pngcairo size 900,560 enhanced font 'sans,10'
set output "acc_vs_time.png"
set title "PyTorch workers through asyncps: 2 shards x 4 workers, SSP s=2" noenhanced
set xlabel "wall time (s)"
set ylabel "test accuracy (rank 0)"
set grid
set key bottom right noenhanced
set yrange [0.75:0.95]
$d0 << EOD
132.96 0.8475
259.05 0.8586
366.53 0.8816
465.48 0.881
599.17 0.9048
692.4 0.9076
812.53 0.9104
931.01 0.9121
1087.65 0.92
1246.09 0.9181
1388.32 0.9212
1531.35 0.9241
1690.8 0.9227
1865.89 0.9239
2037.64 0.9228
EOD
$d1 << EOD
152.17 0.8288
305.13 0.8805
467.32 0.8759
644.26 0.9009
818.96 0.9053
980.85 0.9138
1160.81 0.9142
1382.52 0.919
1594.17 0.9193
1769.14 0.9222
1935.13 0.9267
2091.13 0.9283
2249.54 0.927
2415.2 0.9286
2574.61 0.9288
EOD
$d2 << EOD
1.62 0.8212
3.23 0.8374
4.9 0.8549
6.46 0.8532
7.89 0.8629
9.27 0.8445
10.51 0.8636
11.99 0.8703
13.76 0.8743
15.07 0.8757
15.35 0.8781
EOD
$d3 << EOD
7.96 0.8058
14.62 0.7679
22.74 0.8462
28.32 0.8545
35.69 0.8518
42.84 0.8656
49.13 0.868
54.16 0.8679
60.59 0.8697
65.32 0.8726
66.04 0.8745
EOD
plot $d0 using 1:2 with linespoints pt 7 ps 0.6 lw 2 title "cnn_none", \
     $d1 using 1:2 with linespoints pt 7 ps 0.6 lw 2 title "cnn_topk", \
     $d2 using 1:2 with linespoints pt 7 ps 0.6 lw 2 title "mlp_ps_worker", \
     $d3 using 1:2 with linespoints pt 7 ps 0.6 lw 2 title "mlp_pytorch"
