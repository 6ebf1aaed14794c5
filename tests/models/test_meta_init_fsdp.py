"""FSDP2 over 2 CPU ranks (gloo): a model built on the meta device, sharded, ``to_empty`` and a full state dict
computes as the model the state came from; ``init_weights`` on a CPU mesh refuses (DTensor draws the same shard on
every rank there)."""
import os
import subprocess
import sys
import textwrap

WORKER = textwrap.dedent('''
    import torch, torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    from torch.distributed.fsdp import fully_shard
    from hybrid.models import HybridConfig, HybridLM

    dist.init_process_group("gloo")
    for preset in ("hybrid", "vo-gla", "retnet"):
        config = HybridConfig.preset(preset, "tiny", n_layers=2)
        torch.manual_seed(0)
        source = HybridLM(config)
        with torch.device("meta"):
            model = HybridLM(config)
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        model.to_empty(device="cpu")
        assert model.lm_head.weight is model.embed.weight
        set_model_state_dict(model, source.state_dict(), options=StateDictOptions(full_state_dict=True))
        ids = torch.randint(0, 259, (2, 45), generator=torch.Generator().manual_seed(1))
        torch.testing.assert_close(model(ids)[0], source(ids)[0], rtol=0, atol=0)
        try:
            model.init_weights()
        except ValueError as e:
            assert "CPU ranks" in str(e) and "\\n" not in str(e), str(e)
        else:
            raise AssertionError("init_weights drew into shards of a CPU mesh")
        print(f"rank {dist.get_rank()} {preset} ok", flush=True)
    dist.destroy_process_group()
''')


def test_fsdp2_meta_model_loads_a_full_state_and_refuses_cpu_mesh_draws(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(script)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for rank in (0, 1):
        for preset in ("hybrid", "vo-gla", "retnet"):
            assert f"rank {rank} {preset} ok" in proc.stdout, proc.stdout[-3000:]
