set terminal pngcairo size 900,560 enhanced font 'sans,10'
set output "mlp_crosscheck_acc_vs_epoch.png"
set title "MLP: examples/mlp.py vs ps_worker, 4 PyTorch workers (mean of 3 seeds, 95% band)" noenhanced
set xlabel "epoch (per worker)"
set ylabel "test accuracy (rank 0)"
set grid
set key bottom right noenhanced
set yrange [0.6:0.95]
unset logscale
set label 1 'no data' at graph 0.5,0.5 center
plot [0:1] [0:1] NaN notitle
