set terminal pngcairo size 900,560 enhanced font 'sans,10'
set output "time_to_target.png"
set title "study_any: time to target per configuration (mean, 95% interval)" noenhanced
set xlabel "configuration"
set ylabel "time to target (s)"
set grid
set key outside right top noenhanced
set xrange [0.5:6.5]
set xtics 1
set offsets 0, 0, graph 0.05, graph 0.05
$d0 << EOD
1.0 9.124666666666666 5.495153308188014 12.754180025145319
EOD
$d1 << EOD
2.0 8.939333333333332 3.6568126883499037 14.22185397831676
EOD
$d2 << EOD
3.0 15.844666666666667 2.441211569090866 29.24812176424247
EOD
$d3 << EOD
4.0 8.494 1.5610226459724057 15.426977354027594
EOD
$d4 << EOD
5.0 2.564 0.8995832417031138 4.228416758296886
EOD
$d5 << EOD
6.0 2.7516666666666665 1.634107434152879 3.869225899180454
EOD
plot $d0 using 1:2:3:4 with yerrorbars lw 2 pt 7 ps 0.8 lc 1 title "bsp / none", \
     $d1 using 1:2:3:4 with yerrorbars lw 2 pt 7 ps 0.8 lc 2 title "bsp / topk:ratio=0.01,ef=1", \
     $d2 using 1:2:3:4 with yerrorbars lw 2 pt 7 ps 0.8 lc 3 title "ssp:4 / none", \
     $d3 using 1:2:3:4 with yerrorbars lw 2 pt 7 ps 0.8 lc 4 title "ssp:4 / topk:ratio=0.01,ef=1", \
     $d4 using 1:2:3:4 with yerrorbars lw 2 pt 7 ps 0.8 lc 5 title "asp / none", \
     $d5 using 1:2:3:4 with yerrorbars lw 2 pt 7 ps 0.8 lc 6 title "asp / topk:ratio=0.01,ef=1"
