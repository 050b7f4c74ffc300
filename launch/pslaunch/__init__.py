"""pslaunch: the library behind launch/psrun (Python 3 standard library only).

Modules:
  config   experiment flag files with [server] / [worker] / [psrun] sections
  procs    one launched process (local or over SSH), hostfiles and placement
  fleet    start shards, wait for readiness, start workers, watch, restart, tear down
  summary  SUMMARY-line parsing, the run summary and the progress display
  slurm    srun/sbatch rendering and the Slurm backend
  k8s      Kubernetes manifest rendering
  netns    emulated hosts: network namespaces joined by tc-shaped links (--emulate_hosts)
"""
