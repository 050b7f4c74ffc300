set terminal pngcairo size 900,560 enhanced font 'sans,10'
set output "acc_vs_updates_straggler.png"
set title "Test accuracy vs model updates applied, with one straggler (rank 3, slowdown 3)" noenhanced
set xlabel "model updates applied by the shard (BSP: rounds; SSP/ASP: pushes)"
set ylabel "test accuracy (rank 0)"
set grid
set key bottom right noenhanced
set logscale x
set yrange [0.6:0.92]
$d0 << EOD
38.7 0.6804
78.1 0.7484
121.7 0.7786
158.9 0.8021
197.3 0.8279
239.9 0.8392
278.2 0.8438
317.9 0.8438
358.8 0.8466
399.9 0.8532
437.4 0.8533
479.4 0.8515
518.0 0.8514
560.7 0.86
605.3 0.8613
639.6 0.8372
680.0 0.864
708.0 0.7558
EOD
$d1 << EOD
208.7 0.7706
375.8 0.7998
519.0 0.8151
678.6 0.7966
822.1 0.8488
982.6 0.8468
1158.9 0.8339
1341.5 0.8479
1495.6 0.8628
1652.8 0.8625
1818.2 0.8635
1977.2 0.8637
2127.8 0.8648
2286.8 0.8729
2442.8 0.8699
2601.8 0.861
2774.7 0.8726
2832.0 0.7916
EOD
$d2 << EOD
214.7 0.7835
367.7 0.808
526.0 0.8093
681.6 0.8399
841.3 0.846
1006.2 0.8293
1168.5 0.8553
1325.4 0.8625
1495.5 0.8583
1633.5 0.8649
1800.0 0.8652
1965.1 0.8545
2112.5 0.8587
2295.0 0.8623
2434.1 0.8624
2585.2 0.8575
2759.4 0.8681
2832.0 0.8209
EOD
$d3 << EOD
115.2 0.74
251.5 0.8058
385.4 0.7801
497.3 0.8471
612.1 0.8409
742.7 0.8238
920.2 0.8327
1076.6 0.8491
1220.6 0.8492
1389.4 0.8652
1532.3 0.8631
1704.2 0.8602
1865.2 0.8726
2024.3 0.8574
2220.5 0.8726
2411.1 0.8713
2547.6 0.8667
2729.2 0.8633
EOD
$d4 << EOD
327.3 0.8431
469.0 0.7972
584.3 0.8501
789.7 0.8574
1057.9 0.8591
1274.4 0.8677
1487.9 0.8683
1669.7 0.87
1798.4 0.875
1943.9 0.8701
2062.4 0.8734
2159.8 0.8786
2284.8 0.8715
2377.6 0.8758
2487.8 0.8739
2567.2 0.8806
2674.0 0.871
2807.6 0.8591
EOD
plot $d0 using 1:2 with linespoints pt 7 ps 0.6 lw 2 title "bsp_straggler", \
     $d1 using 1:2 with linespoints pt 7 ps 0.6 lw 2 title "ssp1_straggler", \
     $d2 using 1:2 with linespoints pt 7 ps 0.6 lw 2 title "ssp4_straggler", \
     $d3 using 1:2 with linespoints pt 7 ps 0.6 lw 2 title "ssp16_straggler", \
     $d4 using 1:2 with linespoints pt 7 ps 0.6 lw 2 title "asp_straggler"
