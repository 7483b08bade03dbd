# Engine img/s at batch 256 against PyTorch on the same H100 in the same
# call (engine-h100.tsv): gnuplot engine.gp > engine-h100.png
set terminal pngcairo size 900,540 noenhanced
set title "ResNet-18 engine, batch 256, NVIDIA H100 (688ba12): resnetd vs PyTorch 2.11, same call"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set boxwidth 0.9
set ylabel "images/s (inputs on the GPU)"
set yrange [0:*]
set datafile missing "NaN"
set grid ytics
set key top right
plot "engine-h100.tsv" using 2:xtic(1) title "resnetd" lc rgb "#2b6cb0", \
     "" using 3 title "torch eager (channels-last)" lc rgb "#a0aec0", \
     "" using 4 title "torch + CUDA graph" lc rgb "#718096", \
     "" using 5 title "torch.compile max-autotune" lc rgb "#4a5568"
