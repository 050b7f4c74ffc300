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
1.0 8.132666666666667 3.198812490533946 13.066520842799388
EOD
$d1 << EOD
2.0 12.012 0.2931328053943396 23.73086719460566
EOD
$d2 << EOD
3.0 10.947333333333333 4.257556317727766 17.6371103489389
EOD
$d3 << EOD
4.0 10.266999999999998 6.700562842274978 13.833437157725017
EOD
$d4 << EOD
5.0 4.592333333333333 4.208292284660738 4.976374382005929
EOD
$d5 << EOD
6.0 5.017 -2.7249167076183625 12.758916707618363
EOD
plot $d0 using 1:2:3:4 with yerrorbars lw 2 pt 7 ps 0.8 lc 1 title "bsp / none", \
     $d1 using 1:2:3:4 with yerrorbars lw 2 pt 7 ps 0.8 lc 2 title "bsp / topk:ratio=0.01,ef=1", \
     $d2 using 1:2:3:4 with yerrorbars lw 2 pt 7 ps 0.8 lc 3 title "ssp:4 / none", \
     $d3 using 1:2:3:4 with yerrorbars lw 2 pt 7 ps 0.8 lc 4 title "ssp:4 / topk:ratio=0.01,ef=1", \
     $d4 using 1:2:3:4 with yerrorbars lw 2 pt 7 ps 0.8 lc 5 title "asp / none", \
     $d5 using 1:2:3:4 with yerrorbars lw 2 pt 7 ps 0.8 lc 6 title "asp / topk:ratio=0.01,ef=1"
