"""Other processes' share of the CPU, on a fake psutil and a fake clock, and the busy warning."""

from types import SimpleNamespace

import pytest

from specdemo.core import machine
from specdemo.core.machine import OtherCpuUse, busy_warning, is_busy


class FakePsutil:
    """System-wide and own CPU seconds that the test advances by hand; ``cores`` logical cores."""

    def __init__(self, cores=2):
        self.cores, self.busy, self.own, self.now = cores, 100.0, 10.0, 50.0

    def cpu_times(self):  # busy seconds split over the fields psutil reports (iowait not busy)
        return SimpleNamespace(user=self.busy * 0.6, nice=self.busy * 0.1, system=self.busy * 0.2,
                               irq=self.busy * 0.05, softirq=self.busy * 0.05, idle=999.0,
                               iowait=55.0)

    def Process(self):  # noqa: N802 - psutil's name
        return SimpleNamespace(cpu_times=lambda: SimpleNamespace(user=self.own * 0.75,
                                                                 system=self.own * 0.25))

    def cpu_count(self, logical=True):
        return self.cores

    def advance(self, wall_s, own_s, others_s):
        self.now += wall_s
        self.own += own_s
        self.busy += own_s + others_s


def test_share_is_other_processes_cpu_seconds_over_all_cores_time():
    ps = FakePsutil(cores=2)
    use = OtherCpuUse(ps, clock=lambda: ps.now)
    assert use.share() == 0.0  # no time passed
    ps.advance(wall_s=2.0, own_s=3.0, others_s=1.0)  # 4 core-seconds: 3 ours, 1 theirs
    assert use.elapsed_s() == pytest.approx(2.0)
    assert use.share() == pytest.approx(0.25)
    ps.advance(wall_s=2.0, own_s=0.0, others_s=3.0)  # 8 core-seconds in all, 4 theirs
    assert use.share() == pytest.approx(0.5)


def test_share_is_clamped_and_short_intervals_are_not_measured(monkeypatch):
    ps = FakePsutil(cores=1)
    use = OtherCpuUse(ps, clock=lambda: ps.now)
    ps.advance(wall_s=0.1, own_s=0.2, others_s=-0.05)  # ticks: our time read above the system's
    assert use.share() == 0.0
    assert use.share_if_measurable() is None  # 0.1 s < MIN_MEASURED_S
    ps.advance(wall_s=0.9, own_s=0.0, others_s=5.0)
    assert use.share() == 1.0
    assert use.share_if_measurable() == 1.0
    monkeypatch.setattr(machine, "MIN_MEASURED_S", 2.0)
    assert use.share_if_measurable() is None
    assert use.share_if_measurable(min_s=0.5) == 1.0


def test_real_psutil_gives_a_share_between_0_and_1():
    use = OtherCpuUse()
    sum(i * i for i in range(200_000))
    assert 0.0 <= use.share() <= 1.0 and use.elapsed_s() > 0


def test_busy_warning_names_each_busy_run():
    assert busy_warning({"plain": 0.1, "speculative": None}) is None
    assert busy_warning({"plain": machine.BUSY_SHARE}) is None  # above, not at
    assert not is_busy(None) and is_busy(0.26)
    assert busy_warning({"plain": 0.43, "speculative": 0.02}) == (
        "machine busy: other processes used 43% of the CPU during the plain run; the speedup "
        "is not reliable")
    assert busy_warning({"plain": 0.43, "speculative": 0.3}) == (
        "machine busy: other processes used 43% of the CPU during the plain run and 30% during "
        "the speculative run; the speedup is not reliable")
