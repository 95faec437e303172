"""Building the policy network leaves no files behind: PyG renders GATConv's message passing into source files
in the temporary directory and never deletes them (two per process that builds a network)."""

from __future__ import annotations

import os
import subprocess
import sys

BUILD = """
from agmarl_trainer.model import NetConfig, PolicyNet
import sys
net = PolicyNet(NetConfig())
generated = [name for name in sys.modules if name.startswith("torch_geometric.nn.conv.gat_conv_GATConv_")]
assert len(generated) == 2, generated  # the modules PyG generated are loaded and in use
print(sum(p.numel() for p in net.parameters()))
"""


def test_building_the_network_leaves_no_generated_sources_in_the_temp_dir(tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", BUILD], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout.split()[-1]) > 0
    left = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("torch_geometric"))
    assert left == []
