set terminal pngcairo size 900,560 enhanced font 'sans,10'
set output "idle_vs_staleness.png"
set title "Worker idle fraction (pull wait / wall) vs staleness bound s (BSP = 0)" noenhanced
set xlabel "staleness bound s + 0.5"
set ylabel "mean idle fraction over 4 workers"
set grid
set key top right noenhanced
set logscale x
$d0 << EOD
0.5 0.6053
1.5 0.5298
4.5 0.514
16.5 0.5512
64.5 0.5101
EOD
$d1 << EOD
0.5 0.6234
1.5 0.59
4.5 0.5927
16.5 0.544
64.5 0.3964
EOD
plot $d0 using 1:2 with linespoints pt 7 ps 0.6 lw 2 title "no straggler (x = s + 0.5; ASP at 64.5)", \
     $d1 using 1:2 with linespoints pt 7 ps 0.6 lw 2 title "one straggler (x = s + 0.5; ASP at 64.5)"
