"""One engine over several processes: tensor and pipeline parallelism over torch.distributed."""
