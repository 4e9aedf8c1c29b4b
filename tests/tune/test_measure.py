"""Workers survive what candidates do to them: a crash is a failed trial with its
signal, a hang is a timeout, and the next job runs on a fresh worker."""

from __future__ import annotations

from polyonnx.tune.measure import Job, Workers


def test_crash_and_hang_are_failed_trials(model_path):
    jobs = [Job(model_path, "mm1", [], 1, min_seconds=0.0) for _ in range(4)]
    with Workers(jobs=1, timeout=3, env={"POLYONNX_TUNE_FAULT": "segv:2,hang:3"}) as workers:
        results = [m for _, m in workers.run(jobs)]
    assert [m.status for m in results] == ["ok", "failed", "failed", "ok"]
    assert results[1].reason.startswith("crashed: signal SIGSEGV")
    assert results[2].reason == "timeout after 3 s"
    assert results[0].median_s > 0 and results[3].median_s > 0


def test_a_python_error_in_a_worker_is_a_failed_trial(model_path):
    jobs = [Job(model_path, "no_such_kernel", [], 1), Job(model_path, "mm1", [], 1)]
    with Workers(jobs=2, timeout=30) as workers:
        results = {job.kernel: m for job, m in workers.run(jobs)}
    assert results["no_such_kernel"].status == "failed"
    assert "no kernel named" in results["no_such_kernel"].reason
    assert results["mm1"].status == "ok"


def test_no_job_starts_after_the_deadline(model_path):
    import time

    jobs = [Job(model_path, "mm1", [], 1, min_seconds=0.0) for _ in range(50)]
    with Workers(jobs=1, timeout=30) as workers:
        first = next(iter(workers.run(jobs[:1])))  # a warm worker
        assert first[1].status == "ok"
        done = list(workers.run(jobs, deadline=time.monotonic() + 0.5))
    assert 0 < len(done) < 50
