"""The Python blocks of docs/decoding.md run as written, in order, in one namespace (each builds on the blocks
before it: the first makes the model and the prompts), on the CPU in seconds; so does docs/training.md's
`CompiledBlocks` block ("Compile"), alone, and every Python block of docs/training.md defines each name it uses.

`torch.compile` runs with its "eager" backend here: Dynamo traces what the blocks compile as written (`compile=True`
decode steps, `CompiledBlocks`), and Inductor's lowering, which takes minutes on two cores, is tested on its own
(tests/models/test_generation_compile.py). The blocks that record CUDA graphs need a CUDA device: on the CPU every
name they use is checked to be defined by the blocks before them, and a test of their own, skipped without CUDA,
runs every block where there is one.
"""
import ast
import builtins
import functools
import re
from pathlib import Path

import pytest
import torch

DOCS = Path(__file__).resolve().parents[1] / "docs"
DECODING = (DOCS / "decoding.md").read_text(encoding="utf-8")
TRAINING = (DOCS / "training.md").read_text(encoding="utf-8")


def python_blocks(text: str) -> list[str]:
    """A document's ```python blocks, in order."""
    return [body for info, body in re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.S | re.M) if info == "python"]


def needs_cuda(block: str) -> bool:
    return bool(re.search(r"\.cuda\(\)|cuda-graph", block))


def undefined_names(block: str, defined) -> set[str]:
    """Names ``block`` reads that it never binds and that neither ``defined`` nor the builtins hold."""
    tree = ast.parse(block)
    bound = set(defined) | set(dir(builtins))
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            bound.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
    read = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return read - bound


@pytest.fixture
def eager_compile(monkeypatch):
    """``torch.compile`` with the "eager" backend unless a call names another."""
    torch.compiler.reset()
    compile_ = torch.compile
    monkeypatch.setattr(torch, "compile", functools.partial(compile_, backend="eager"))
    yield
    torch.compiler.reset()


def run_blocks(blocks: list[str], doc: str, *, cuda: bool) -> dict:
    """Run ``blocks`` in order in one namespace; without ``cuda`` a block that needs it has its names checked."""
    torch.manual_seed(0)
    namespace: dict = {"__name__": f"{doc}_blocks"}
    for index, block in enumerate(blocks):
        if needs_cuda(block) and not cuda:
            assert not undefined_names(block, namespace), (doc, index, undefined_names(block, namespace))
            continue
        exec(compile(block, f"{doc} python block {index}", "exec"), namespace)
    return namespace


def test_the_docs_show_python_blocks():
    blocks = python_blocks(DECODING)
    assert len(blocks) >= 6 and any("Decoder(" in b for b in blocks) and any("draft=" in b for b in blocks)
    assert sum(needs_cuda(b) for b in blocks) == 2  # the two CUDA-graph blocks; every other one runs on the CPU
    assert any("CompiledBlocks(" in b for b in python_blocks(TRAINING))


def test_the_decoding_blocks_run_in_order(one_torch_thread, eager_compile):
    namespace = run_blocks(python_blocks(DECODING), "docs/decoding.md", cuda=False)
    assert len(namespace["rows"]) == 2 and len(namespace["outputs"]) == len(namespace["requests"]) == 3
    assert 0.0 <= namespace["stats"].acceptance_rate <= 1.0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA-graph blocks of docs/decoding.md need a CUDA "
                                                          "device (on the CPU their names are checked)")
def test_the_decoding_blocks_run_in_order_on_cuda(eager_compile):
    namespace = run_blocks(python_blocks(DECODING), "docs/decoding.md", cuda=True)
    assert namespace["out"].is_cuda and len(namespace["done"]) == 3


def test_the_compiled_blocks_block_of_training_md_runs(one_torch_thread, eager_compile):
    (block,) = [b for b in python_blocks(TRAINING) if "CompiledBlocks(" in b]
    namespace = run_blocks([block], "docs/training.md", cuda=False)
    assert namespace["logits"].shape[:2] == (1, 100)


@pytest.mark.parametrize("index", range(len(python_blocks(TRAINING))))
def test_every_python_block_of_training_md_defines_its_names(index):
    """Each block stands alone: every name it uses is imported or assigned in it (the "From Python" block trains
    for minutes, so this one is not run)."""
    block = python_blocks(TRAINING)[index]
    assert not undefined_names(block, ()), undefined_names(block, ())
