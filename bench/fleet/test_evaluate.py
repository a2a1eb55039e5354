"""The fleet evaluation's scoring, on trials and alert episodes laid out by hand.

Run: python3 -m unittest bench/fleet/test_evaluate.py (agent/tests/fleet.rs does).
"""

import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from evaluate import score, stretch_lengths  # noqa: E402
from quiet_total import total  # noqa: E402


SIX = {f"n{i}": "a" for i in range(1, 7)}


def trial(cause, node, degraded_at, restored_at):
    return {"cause": cause, "node": node, "degraded_at": degraded_at, "restored_at": restored_at}


def episode(node, signal, start):
    return {"node": node, "signal": signal, "start": start, "end": start + 30}


class Score(unittest.TestCase):
    def test_a_fleet_that_finds_every_trial_and_nothing_else(self):
        trials = [trial("thermal", "n1", 1000, 1060), trial("infiniband", "n2", 1200, 1260)]
        episodes = [episode("n1", "sm_clock_ratio", 1022), episode("n1", "clock_throttled_gpus_ratio", 1025),
                    episode("n2", "infiniband_xmit_wait_per_second", 1219)]
        r = score(trials, episodes, start=0, end=2000, linger_secs=90, group_of=SIX)
        self.assertEqual((r["detected"], r["recall"], r["precision"]), (2, 1.0, 1.0))
        self.assertEqual(r["latency_median_secs"], 20.5)
        self.assertEqual(r["named_rightly"], 2)
        self.assertEqual(r["false_episodes"], 0)
        # Quiet: 0-1000, 1150-1200, 1350-2000.
        self.assertAlmostEqual(r["quiet_fleet_hours"], 1700 / 3600)

    def test_alerts_elsewhere_or_long_after_are_false(self):
        trials = [trial("hbm", "n1", 1000, 1060)]
        episodes = [episode("n1", "hbm_peak_ratio", 1030),
                    episode("n3", "unexplained_ratio", 1040),  # another node, during the trial
                    episode("n1", "jitter_wakeup_p99_seconds", 1200),  # past the linger
                    episode("n4", "steal_ratio", 500)]  # before any trial
        r = score(trials, episodes, start=0, end=2000, linger_secs=90, group_of=SIX)
        self.assertEqual(r["precision"], 0.25)
        self.assertEqual(r["false_episodes"], 3)
        # The one during the trial is false but not in quiet time.
        self.assertEqual(r["false_episodes_in_quiet_time"], 2)
        quiet_hours = (1000 + (2000 - 1150)) / 3600
        self.assertAlmostEqual(r["false_alerts_per_quiet_fleet_hour"], 2 / quiet_hours)

    def test_a_missed_trial_and_a_wrong_signal(self):
        trials = [trial("pcie", "n1", 1000, 1060), trial("nvlink", "n2", 1300, 1360)]
        episodes = [episode("n2", "unexplained_ratio", 1320)]
        r = score(trials, episodes, start=0, end=2000, linger_secs=90, group_of=SIX)
        self.assertEqual((r["detected"], r["recall"]), (1, 0.5))
        self.assertEqual(r["named_rightly"], 0, "found the node, but not by its NVLink")
        self.assertFalse(trials[0]["detected"])
        self.assertIsNone(trials[0]["latency_secs"])

    def test_the_same_node_twice_credits_the_later_trial(self):
        # The second degradation begins while the first one's alerts may still linger.
        trials = [trial("cpu", "n1", 1000, 1060), trial("infiniband", "n1", 1080, 1140)]
        episodes = [episode("n1", "jitter_wakeup_p99_seconds", 1021),
                    episode("n1", "infiniband_xmit_wait_per_second", 1103)]
        r = score(trials, episodes, start=0, end=2000, linger_secs=90, group_of=SIX)
        self.assertEqual([t["latency_secs"] for t in trials], [21, 23])
        self.assertEqual(r["named_rightly"], 2)

    def test_each_peer_group_has_its_own_quiet_time(self):
        # Two groups of three: a trial in one leaves the other quiet.
        groups = {"a1": "a", "a2": "a", "a3": "a", "b1": "b", "b2": "b", "b3": "b"}
        trials = [trial("thermal", "a1", 1000, 1060)]
        episodes = [episode("a1", "sm_clock_ratio", 1020),
                    episode("a2", "steal_ratio", 1030),  # its group is busy: not quiet
                    episode("b2", "steal_ratio", 1040)]  # its group is quiet
        r = score(trials, episodes, start=0, end=2000, linger_secs=90, group_of=groups)
        self.assertEqual(r["groups"], 2)
        self.assertEqual(r["nodes"], 6)
        self.assertEqual(r["false_episodes"], 2)
        self.assertEqual(r["false_episodes_in_quiet_time"], 1)
        self.assertAlmostEqual(r["quiet_fleet_hours"], (2000 - 150 + 2000) / 3600)


class StretchLengths(unittest.TestCase):
    def test_stretches_are_counted_by_length(self):
        # 100-105 (2), 200 (1), 300-315 (4), 400-405 (2)
        times = [100, 105, 200, 300, 305, 310, 315, 400, 405]
        self.assertEqual(stretch_lengths(times, 5), {2: 2, 1: 1, 4: 1})
        self.assertEqual(stretch_lengths([], 5), {})
        self.assertEqual(stretch_lengths([7.0], 5), {1: 1})


class QuietTotal(unittest.TestCase):
    def run_of(self, hours, false, rules="r1", revisions=("abc",)):
        return {"quiet_fleet_hours": hours, "false_episodes_in_quiet_time": false,
                "rules_sha256": rules, "vtax_revisions": list(revisions)}

    def test_matching_runs_add_up(self):
        t = total([self.run_of(11.0, 0), self.run_of(13.0, 1)])
        self.assertEqual((t["runs"], t["quiet_fleet_hours"], t["false_episodes_in_quiet_time"]), (2, 24.0, 1))
        self.assertEqual(t["false_alerts_per_quiet_fleet_day"], 1.0)

    def test_runs_of_other_rules_or_builds_do_not(self):
        with self.assertRaisesRegex(ValueError, "rules_sha256"):
            total([self.run_of(1, 0), self.run_of(1, 0, rules="r2")])
        with self.assertRaisesRegex(ValueError, "vtax_revisions"):
            total([self.run_of(1, 0), self.run_of(1, 0, revisions=("abc", "def"))])
        with self.assertRaisesRegex(ValueError, "does not say"):
            total([self.run_of(1, 0, rules=None)])


if __name__ == "__main__":
    unittest.main()
