"""The GPU check's pytest child imports the library from links to this process's modules, with the checkout's
root off ``sys.path`` as tests/conftest.py leaves it (on the device machine the root was the only way in)."""
import json
import subprocess
import sys
from pathlib import Path

import hybrid.kernels
import hybrid.train
from hybrid.train.bench.gpu_check.importable import child_env, package_site

REPO = Path(__file__).resolve().parents[4]

PROBE = """
import json, sys
from pathlib import Path
root = Path({repo!r})
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != root]  # as tests/conftest.py does
import hybrid, hybrid.kernels.complex_scan, hybrid.models, hybrid.train.bench.gpu_check
print(json.dumps({{name: sys.modules[name].__file__ for name in
                   ("hybrid", "hybrid.kernels", "hybrid.models", "hybrid.train")}}))
"""


def test_child_imports_the_same_modules_through_the_site(tmp_path):
    site = package_site(tmp_path)
    assert package_site(tmp_path) == site  # a second call keeps the links
    done = subprocess.run([sys.executable, "-c", PROBE.format(repo=str(REPO))], cwd=tmp_path,
                          env=child_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    files = json.loads(done.stdout.strip().splitlines()[-1])
    assert all(f.startswith(str(site)) for f in files.values()), files
    for name, module in (("hybrid.kernels", hybrid.kernels), ("hybrid.train", hybrid.train)):
        assert Path(files[name]).resolve() == Path(module.__file__).resolve()
