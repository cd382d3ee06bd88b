"""How OpenMP threads wait is chosen when specdemo is imported (specdemo/_omp.py): spinning
unless other processes want the cores our threads need; the user's own setting wins."""

import json
import os
import subprocess
import sys

from specdemo import _omp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROBE = ("import specdemo, os, sys, json; print(json.dumps([specdemo.OMP_WAIT, "
         "os.environ.get('OMP_WAIT_POLICY'), 'torch' in sys.modules]))")


def probe(**env):
    clean = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env={**clean, **env},
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def stat_file(tmp_path, running):
    """A /proc/stat stand-in with ``running`` runnable tasks."""
    path = tmp_path / "stat"
    path.write_text("cpu  1 2 3 4\nprocs_running %d\nprocs_blocked 0\n" % running)
    return path


def test_threads_spin_when_they_fit_beside_the_other_runnable_tasks():
    assert _omp.choose(0, 2) == "spin"
    assert _omp.choose(1, 2) == "passive"  # one busy process on 2 cores: the team would wait on it
    assert _omp.choose(2, 16) == "spin"  # 8 threads beside 2 others on 16 cores
    assert _omp.choose(9, 16) == "passive"
    assert _omp.choose(None, 2) == "passive"  # unknown (no /proc/stat): as before the measurement


def test_other_runnable_tasks_are_read_from_proc_stat_without_our_own(tmp_path):
    assert _omp.others_running(str(stat_file(tmp_path, 3)), samples=3, interval_s=0) == 2
    assert _omp.others_running(str(stat_file(tmp_path, 1)), samples=1, interval_s=0) == 0
    assert _omp.others_running(str(tmp_path / "missing")) is None
    (tmp_path / "odd").write_text("cpu 1 2 3\n")
    assert _omp.others_running(str(tmp_path / "odd")) is None


def test_apply_sets_passive_only_when_the_cores_are_wanted(tmp_path):
    cores = _omp.usable_cores()
    (tmp_path / "b").mkdir()
    busy = stat_file(tmp_path / "b", cores + 9)
    env = {}
    decision = _omp.apply(env, str(busy))
    assert decision["policy"] == "passive" and env == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert decision["others_running"] == cores + 8
    (tmp_path / "q").mkdir()
    quiet = stat_file(tmp_path / "q", 1)
    env = {}
    decision = _omp.apply(env, str(quiet))
    assert decision == {"policy": "spin", "others_running": 0, "cores": cores, "setting": {}}
    assert env == {}
    assert "spin" in _omp.describe(decision) and "0 other runnable" in _omp.describe(decision)


def test_the_users_own_setting_wins(tmp_path):
    busy = stat_file(tmp_path, 99)
    for user in ({"OMP_WAIT_POLICY": "ACTIVE"}, {"GOMP_SPINCOUNT": "1000"}):
        env = dict(user)
        decision = _omp.apply(env, str(busy))
        assert env == user and decision["policy"] == "user" and decision["setting"] == user
        assert next(iter(user.values())) in _omp.describe(decision)


def test_importing_specdemo_decides_before_torch_loads_and_says_what_it_set():
    decision, env_value, torch_loaded = probe()
    assert not torch_loaded  # importing specdemo does not load torch, so the choice is in time
    assert decision["policy"] in ("spin", "passive")
    assert env_value == ("PASSIVE" if decision["policy"] == "passive" else None)
    decision, env_value, _ = probe(OMP_WAIT_POLICY="ACTIVE")
    assert env_value == "ACTIVE" and decision["policy"] == "user"


def test_llama_cpp_programs_do_not_inherit_the_passive_setting_made_here():
    passive = {"policy": "passive", "others_running": 3, "cores": 2,
               "setting": {"OMP_WAIT_POLICY": "PASSIVE"}}
    env = _omp.child_env(passive, {"PATH": "/bin", "OMP_WAIT_POLICY": "PASSIVE"})
    assert env == {"PATH": "/bin"}
    user = {"policy": "user", "others_running": None, "cores": 2,
            "setting": {"OMP_WAIT_POLICY": "PASSIVE"}}
    assert _omp.child_env(user, {"OMP_WAIT_POLICY": "PASSIVE"}) == {"OMP_WAIT_POLICY": "PASSIVE"}


def test_a_task_runnable_only_in_some_samples_is_not_counted(tmp_path, monkeypatch):
    reads = iter([4, 1, 3])  # a process starting up shows in some reads only
    path = tmp_path / "stat"

    def fake_sleep(_):
        path.write_text("procs_running %d\n" % next(reads))
    path.write_text("procs_running 2\n")
    monkeypatch.setattr(_omp.time, "sleep", fake_sleep)
    assert _omp.others_running(str(path), samples=3, interval_s=0) == 0
