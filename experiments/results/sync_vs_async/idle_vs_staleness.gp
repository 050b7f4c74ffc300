set terminal pngcairo size 900,560 enhanced font 'sans,10'
set output "idle_vs_staleness.png"
set title "Worker idle fraction (pull wait / wall) vs staleness bound s (BSP = 0), mean of 5 seeds, 95% interval" noenhanced
set xlabel "staleness bound s + 0.5"
set ylabel "mean idle fraction over 4 workers"
set grid
set key top right noenhanced
set logscale x
$d0 << EOD
0.5 0.5898 0.5828 0.5968
1.5 0.5015 0.49249999999999994 0.5105
4.5 0.4599 0.4486 0.47119999999999995
16.5 0.4515 0.4383 0.4647
64.5 0.3467 0.34 0.3534
EOD
$d1 << EOD
0.5 0.6324 0.6226999999999999 0.6421
1.5 0.5927 0.5883 0.5971
4.5 0.5408 0.5341999999999999 0.5474
16.5 0.542 0.5394 0.5446000000000001
64.5 0.289 0.2784 0.2996
EOD
plot $d0 using 1:2:3:4 with yerrorlines lw 2 pt 7 ps 0.8 lc 1 title "no straggler (x = s + 0.5; ASP at 64.5)", \
     $d1 using 1:2:3:4 with yerrorlines lw 2 pt 7 ps 0.8 lc 2 title "one straggler (x = s + 0.5; ASP at 64.5)"
