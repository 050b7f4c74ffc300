set terminal pngcairo size 900,560 enhanced font 'sans,10'
set output "acc_vs_time_straggler.png"
set title "Test accuracy vs wall time, 4 workers, with one straggler (rank 3, slowdown 3)" noenhanced
set xlabel "wall time of rank 0 (s)"
set ylabel "test accuracy (rank 0)"
set grid
set key bottom right noenhanced
set yrange [0.6:0.92]
$d0 << EOD
0.644 0.6804
1.18 0.7484
1.91 0.7786
2.483 0.8021
3.126 0.8279
3.8 0.8392
4.316 0.8438
4.856 0.8438
5.437 0.8466
6.094 0.8532
6.634 0.8533
7.475 0.8515
8.16 0.8514
8.984 0.86
9.859 0.8613
10.637 0.8372
11.256 0.864
11.849 0.7558
EOD
$d1 << EOD
0.881 0.7706
1.498 0.7998
2.079 0.8151
3.212 0.7966
4.04 0.8488
5.111 0.8468
6.373 0.8339
7.127 0.8479
7.612 0.8628
8.137 0.8625
8.623 0.8635
9.088 0.8637
9.636 0.8648
10.216 0.8729
10.859 0.8699
11.478 0.861
12.107 0.8726
12.523 0.7916
EOD
$d2 << EOD
0.679 0.7835
1.074 0.808
1.558 0.8093
2.059 0.8399
2.739 0.846
3.303 0.8293
3.815 0.8553
4.269 0.8625
4.772 0.8583
5.258 0.8649
5.964 0.8652
6.616 0.8545
7.222 0.8587
8.193 0.8623
9.207 0.8624
10.551 0.8575
12.09 0.8681
12.742 0.8209
EOD
$d3 << EOD
0.776 0.74
1.728 0.8058
2.46 0.7801
2.889 0.8471
3.271 0.8409
3.664 0.8238
4.326 0.8327
4.847 0.8491
5.293 0.8492
5.807 0.8652
6.257 0.8631
6.848 0.8602
7.333 0.8726
7.882 0.8574
8.602 0.8726
9.332 0.8713
9.738 0.8667
10.878 0.8633
EOD
$d4 << EOD
1.052 0.8431
1.634 0.7972
2.075 0.8501
2.81 0.8574
3.437 0.8591
3.99 0.8677
4.621 0.8683
5.275 0.87
5.648 0.875
6.012 0.8701
6.318 0.8734
6.631 0.8786
6.945 0.8715
7.282 0.8758
7.972 0.8739
8.429 0.8806
9.503 0.871
10.365 0.8591
EOD
plot $d0 using 1:2 with linespoints pt 7 ps 0.6 lw 2 title "bsp_straggler", \
     $d1 using 1:2 with linespoints pt 7 ps 0.6 lw 2 title "ssp1_straggler", \
     $d2 using 1:2 with linespoints pt 7 ps 0.6 lw 2 title "ssp4_straggler", \
     $d3 using 1:2 with linespoints pt 7 ps 0.6 lw 2 title "ssp16_straggler", \
     $d4 using 1:2 with linespoints pt 7 ps 0.6 lw 2 title "asp_straggler"
