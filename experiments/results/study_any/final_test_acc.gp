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
1.0 0.7284444444444444 0.6519125136208879 0.804976375268001
EOD
$d1 << EOD
2.0 0.7269444444444444 0.6722427309317738 0.781646157957115
EOD
$d2 << EOD
3.0 0.7611111111111111 0.7267788127466752 0.7954434094755469
EOD
$d3 << EOD
4.0 0.7374444444444445 0.7082585180940695 0.7666303707948194
EOD
$d4 << EOD
5.0 0.7323888888888889 0.6335992182816937 0.831178559496084
EOD
$d5 << EOD
6.0 0.7613333333333333 0.6856146588611896 0.8370520078054771
EOD
plot $d0 using 1:2:3:4 with yerrorbars lw 2 pt 7 ps 0.8 lc 1 title "bsp / none", \
     $d1 using 1:2:3:4 with yerrorbars lw 2 pt 7 ps 0.8 lc 2 title "bsp / topk:ratio=0.01,ef=1", \
     $d2 using 1:2:3:4 with yerrorbars lw 2 pt 7 ps 0.8 lc 3 title "ssp:4 / none", \
     $d3 using 1:2:3:4 with yerrorbars lw 2 pt 7 ps 0.8 lc 4 title "ssp:4 / topk:ratio=0.01,ef=1", \
     $d4 using 1:2:3:4 with yerrorbars lw 2 pt 7 ps 0.8 lc 5 title "asp / none", \
     $d5 using 1:2:3:4 with yerrorbars lw 2 pt 7 ps 0.8 lc 6 title "asp / topk:ratio=0.01,ef=1"
