"""The training records' clock covers the GPU work the steps queued: the loop waits for the device at each record
boundary before it reads the clock (nothing in a step waits for it earlier), so tokens/s is not how fast the host
queues work."""
import torch

import hybrid.train.loop.loop as loop_module
from hybrid.train.lm.config import TrainConfig
from hybrid.train.lm.trainer import Trainer


def test_the_loop_waits_for_the_device_at_each_record_and_only_there(corpus, tmp_path, monkeypatch):
    waits = []
    monkeypatch.setattr(loop_module, "_wait_for", lambda device: waits.append(device))
    config = TrainConfig(model={"d_model": 32, "n_layers": 3, "n_heads": 2, "window": 16}, data=str(corpus),
                         seq_len=32, batch_size=4, steps=5, warmup=1, eval_every=0, eval_batches=1, log_every=2,
                         save_every=0, out=str(tmp_path / "run"), device="cpu")
    Trainer(config, verbose=0, progress=False).fit()
    assert len(waits) == 3  # the records of steps 2, 4 and the last, 5


def test_waiting_for_a_cuda_device_synchronises_it(monkeypatch):
    synced = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synced.append(device))
    loop_module._wait_for(torch.device("cpu"))
    assert synced == []
    loop_module._wait_for(torch.device("cuda", 0))
    assert synced == [torch.device("cuda", 0)]

