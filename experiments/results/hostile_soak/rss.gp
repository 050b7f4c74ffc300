# Shard RSS during the hostile soak (ASan+UBSan ps_server, 1,000,000 hostile
# requests beside a training worker) vs its memory budget.
#   gnuplot rss.gp   (from experiments/results/hostile_soak)
set terminal pngcairo size 900,450
set output "rss.png"
set datafile separator ","
set key top right noenhanced
set xlabel "time (s)"
set ylabel "shard RSS (MiB)"
set yrange [0:560]
set title "Hostile soak: shard RSS (ASan build, quarantine 32 MiB) and memory budget" noenhanced
plot "hostile.rss.csv" every ::1 using 1:($2/1024) with lines lw 2 title "RSS, 1,000,000 hostile requests + worker", \
     "baseline.rss.csv" every ::1 using 1:($2/1024) with lines lw 2 title "RSS, worker alone", \
     512 with lines dt 2 lc rgb "red" title "--memory_budget_mb=512"
