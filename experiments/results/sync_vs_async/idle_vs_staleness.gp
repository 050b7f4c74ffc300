set terminal pngcairo size 900,560 enhanced font 'sans,10'
set output "idle_vs_staleness.png"
set title "Worker idle fraction (pull wait / wall) vs staleness bound s (BSP = 0), mean of 3 seeds, 95% interval" noenhanced
set xlabel "staleness bound s + 0.5"
set ylabel "mean idle fraction over 4 workers"
set grid
set key top right noenhanced
set logscale x
$d0 << EOD
0.5 0.5765 0.48450000000000004 0.6685
1.5 0.5062 0.4926 0.5197999999999999
4.5 0.4879 0.4857 0.4901
16.5 0.4611 0.4083 0.5139
64.5 0.3682 0.3216 0.41480000000000006
EOD
$d1 << EOD
0.5 0.6329 0.6281 0.6377
1.5 0.5856 0.5453 0.6259
4.5 0.5657 0.5071 0.6243
16.5 0.5562 0.5319 0.5805
64.5 0.2989 0.2768 0.321
EOD
plot $d0 using 1:2:3:4 with yerrorlines lw 2 pt 7 ps 0.8 lc 1 title "no straggler (x = s + 0.5; ASP at 64.5)", \
     $d1 using 1:2:3:4 with yerrorlines lw 2 pt 7 ps 0.8 lc 2 title "one straggler (x = s + 0.5; ASP at 64.5)"
