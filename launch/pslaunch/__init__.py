"""pslaunch: the library behind launch/psrun (Python 3 standard library only).

Modules:
  config   experiment flag files with [server] / [worker] / [psrun] sections
  binaries where the ps_server / ps_worker / ps_ctl binaries are, and whether they are there
  procs    one launched process (local or over SSH), hostfiles and placement
  member   a fleet's member (one logical process) and LaunchError, which names one
  fleet    start shards, wait for readiness, start workers, watch, restart, tear down
  elastic  psrun --elastic: shards join and leave while the fleet trains
  summary  SUMMARY-line parsing, the run summary and the progress display
  slurm    srun/sbatch rendering and the Slurm backend
  k8s      Kubernetes manifest rendering
  netns    emulated hosts: network namespaces joined by tc-shaped links (--emulate_hosts)
"""
