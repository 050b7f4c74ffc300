set terminal pngcairo size 900,560 enhanced font 'sans,10'
set output "final_test_acc.png"
set title "study_any: final test_acc per configuration (mean, 95% interval)" noenhanced
set xlabel "configuration"
set ylabel "final test acc"
set grid
set key outside right top noenhanced
set xrange [0.5:6.5]
set xtics 1
set offsets 0, 0, graph 0.05, graph 0.05
$d0 << EOD
1.0 0.7549444444444445 0.6508982991616283 0.8589905897272607
EOD
$d1 << EOD
2.0 0.8015555555555557 0.7668335327641033 0.8362775783470081
EOD
$d2 << EOD
3.0 0.7855555555555557 0.7702572347386676 0.8008538763724438
EOD
$d3 << EOD
4.0 0.7656666666666667 0.6991222167278144 0.832211116605519
EOD
$d4 << EOD
5.0 0.7861111111111111 0.754351655412465 0.8178705668097572
EOD
$d5 << EOD
6.0 0.7962222222222222 0.7849190670488891 0.8075253773955552
EOD
plot $d0 using 1:2:3:4 with yerrorbars lw 2 pt 7 ps 0.8 lc 1 title "bsp / none", \
     $d1 using 1:2:3:4 with yerrorbars lw 2 pt 7 ps 0.8 lc 2 title "bsp / topk:ratio=0.01,ef=1", \
     $d2 using 1:2:3:4 with yerrorbars lw 2 pt 7 ps 0.8 lc 3 title "ssp:4 / none", \
     $d3 using 1:2:3:4 with yerrorbars lw 2 pt 7 ps 0.8 lc 4 title "ssp:4 / topk:ratio=0.01,ef=1", \
     $d4 using 1:2:3:4 with yerrorbars lw 2 pt 7 ps 0.8 lc 5 title "asp / none", \
     $d5 using 1:2:3:4 with yerrorbars lw 2 pt 7 ps 0.8 lc 6 title "asp / topk:ratio=0.01,ef=1"
