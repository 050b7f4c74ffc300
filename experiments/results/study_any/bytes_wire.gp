set terminal pngcairo size 900,560 enhanced font 'sans,10'
set output "bytes_wire.png"
set title "study_any: bytes on the wire per configuration (mean, 95% interval)" noenhanced
set xlabel "configuration"
set ylabel "bytes on the wire (MiB)"
set grid
set key outside right top noenhanced
set xrange [0.5:6.5]
set xtics 1
set offsets 0, 0, graph 0.05, graph 0.05
$d0 << EOD
1.0 93.86477661132812 93.86477661132812 93.86477661132812
EOD
$d1 << EOD
2.0 62.974884033203125 62.974884033203125 62.974884033203125
EOD
$d2 << EOD
3.0 93.86477661132812 93.86477661132812 93.86477661132812
EOD
$d3 << EOD
4.0 62.974884033203125 62.974884033203125 62.974884033203125
EOD
$d4 << EOD
5.0 93.86477661132812 93.86477661132812 93.86477661132812
EOD
$d5 << EOD
6.0 62.974884033203125 62.974884033203125 62.974884033203125
EOD
plot $d0 using 1:2:3:4 with yerrorbars lw 2 pt 7 ps 0.8 lc 1 title "bsp / none", \
     $d1 using 1:2:3:4 with yerrorbars lw 2 pt 7 ps 0.8 lc 2 title "bsp / topk:ratio=0.01,ef=1", \
     $d2 using 1:2:3:4 with yerrorbars lw 2 pt 7 ps 0.8 lc 3 title "ssp:4 / none", \
     $d3 using 1:2:3:4 with yerrorbars lw 2 pt 7 ps 0.8 lc 4 title "ssp:4 / topk:ratio=0.01,ef=1", \
     $d4 using 1:2:3:4 with yerrorbars lw 2 pt 7 ps 0.8 lc 5 title "asp / none", \
     $d5 using 1:2:3:4 with yerrorbars lw 2 pt 7 ps 0.8 lc 6 title "asp / topk:ratio=0.01,ef=1"
