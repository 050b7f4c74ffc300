set terminal pngcairo size 900,560 enhanced font 'sans,10'
set output "acc_vs_time_slow.png"
set title "Test accuracy vs wall time (4 workers), loopback shaped to 100mbit (pulls int8)" noenhanced
set xlabel "wall time of rank 0 (s)"
set ylabel "test accuracy (rank 0)"
set grid
set key bottom right noenhanced
set yrange [0.5:0.92]
$d0 << EOD
16.98 0.6528
31.903 0.7515
49.393 0.8193
65.462 0.8329
82.787 0.8109
99.772 0.8394
116.137 0.8343
131.859 0.8561
148.547 0.8463
164.363 0.8535
180.444 0.8489
192.572 0.8455
EOD
$d1 << EOD
9.63 0.7419
19.568 0.7723
29.156 0.815
39.571 0.8241
49.122 0.8174
58.823 0.8371
68.97 0.8467
78.814 0.8547
88.719 0.8533
98.038 0.8556
108.107 0.8579
115.548 0.8351
EOD
$d2 << EOD
7.223 0.7391
13.843 0.7833
20.587 0.799
27.18 0.8211
34.481 0.8126
41.269 0.8113
47.606 0.8235
54.57 0.8422
61.132 0.8513
67.539 0.8494
74.27 0.8394
79.856 0.849
EOD
$d3 << EOD
5.83 0.6506
11.476 0.8113
17.165 0.8246
22.637 0.8292
28.152 0.839
34.049 0.8356
38.813 0.8477
43.615 0.8302
49.151 0.8524
53.84 0.8525
59.544 0.8504
64.159 0.8505
EOD
$d4 << EOD
4.068 0.8082
8.468 0.8358
12.172 0.8328
16.022 0.8448
19.724 0.838
23.364 0.8524
27.363 0.844
31.207 0.8541
35.339 0.8495
39.453 0.8473
43.06 0.8604
45.817 0.8481
EOD
$d5 << EOD
4.647 0.8033
8.872 0.8231
12.527 0.8342
16.742 0.8459
20.382 0.8537
23.805 0.8468
27.514 0.8438
31.046 0.8498
34.36 0.8526
37.921 0.8612
41.395 0.8566
44.052 0.856
EOD
$d6 << EOD
7.38 0.7613
12.297 0.7364
16.229 0.8085
19.966 0.7934
23.22 0.7872
26.572 0.8131
30.026 0.8257
33.326 0.8164
37.162 0.8398
40.469 0.8232
44.224 0.8425
47.686 0.8403
EOD
plot $d0 using 1:2 with linespoints pt 7 ps 0.6 lw 2 title "none_slow", \
     $d1 using 1:2 with linespoints pt 7 ps 0.6 lw 2 title "fp16_slow", \
     $d2 using 1:2 with linespoints pt 7 ps 0.6 lw 2 title "int8_slow", \
     $d3 using 1:2 with linespoints pt 7 ps 0.6 lw 2 title "qsgd4_slow", \
     $d4 using 1:2 with linespoints pt 7 ps 0.6 lw 2 title "sign_ef_slow", \
     $d5 using 1:2 with linespoints pt 7 ps 0.6 lw 2 title "topk1_ef_slow", \
     $d6 using 1:2 with linespoints pt 7 ps 0.6 lw 2 title "topk01_ef_dgc_slow"
