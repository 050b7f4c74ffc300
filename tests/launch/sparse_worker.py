#!/usr/bin/python3
"""A psrun --worker_cmd worker that trains a model with a sparse table:
SparseEmbedding (AdaGrad rows on the shards) + a dense linear layer, on
synthetic ids and labels from a fixed seed. Run under ps_server
--consistency=bsp --sparse_consistency=asp with ids disjoint between ranks:
the dense layer moves in BSP rounds and each rank's rows change only by its
own pushes, so the final weights do not depend on timing (the elastic
launch tests compare them bitwise with a run of fixed membership).

    sparse_worker.py --steps N --out FILE     (FILE: {rank} is replaced)

Writes torch.save(ps.state_dict()) of the final weights (the table's rows of
every id included) to FILE and prints the SUMMARY line psrun reads."""
import argparse

import torch

import asyncps.torch as apt
from asyncps.env import worker_env
from asyncps.metrics import TrainingLog

IDS_PER_RANK = 512
DIM = 8
BATCH = 16
IDS_PER_EXAMPLE = 4


class Model(torch.nn.Module):
    def __init__(self, num_workers):
        super().__init__()
        self.emb = apt.SparseEmbedding("ids", DIM, optimizer="adagrad", lr=0.1, seed=3,
                                       num_embeddings=IDS_PER_RANK * num_workers)
        self.fc = torch.nn.Linear(DIM, 2)

    def forward(self, ids):
        return self.fc(self.emb(ids).mean(1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--out", required=True)
    a, _ = ap.parse_known_args()
    torch.manual_seed(1)  # every rank starts from the same dense layer
    ps = apt.ParameterServer(Model(worker_env().num_workers), timeout_s=60)
    model = ps.model
    opt = apt.DistributedOptimizer(ps)
    g = torch.Generator().manual_seed(100 + ps.rank)
    log = TrainingLog(ps.rank, a.steps, log_every=0)
    for step in range(a.steps):
        # This rank's ids only: IDS_PER_RANK * rank ... + IDS_PER_RANK - 1.
        ids = torch.randint(0, IDS_PER_RANK, (BATCH, IDS_PER_EXAMPLE), generator=g)
        ids += IDS_PER_RANK * ps.rank
        labels = (ids.sum(1) % 2).long()
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(ids), labels)
        loss.backward()
        opt.step()
        log.step(step, 0, BATCH, float(loss), 0.0, ps.traffic())
    ps.flush()
    torch.save(ps.state_dict(), a.out.replace("{rank}", str(ps.rank)))
    log.finish(a.steps, ps.traffic())
    ps.close()


if __name__ == "__main__":
    main()
