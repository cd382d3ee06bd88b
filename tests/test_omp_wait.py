"""OpenMP threads wait passively unless the user said otherwise: spinning threads made forwards
10-30x slower whenever another process shared the cores (README, "Performance on a CPU")."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROBE = "import specdemo, os; print(os.environ.get('OMP_WAIT_POLICY'))"


def probe(**env) -> str:
    clean = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env={**clean, **env},
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_specdemo_sets_passive_waiting_before_torch_loads():
    assert probe() == "PASSIVE"
    out = subprocess.run([sys.executable, "-c", "import specdemo, sys; print('torch' in sys.modules)"],
                         cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"  # importing specdemo does not load torch (so it is in time)


def test_the_users_own_setting_wins():
    assert probe(OMP_WAIT_POLICY="ACTIVE") == "ACTIVE"
