"""The CLI's progress bars for phases that run one after another (calibrate, export): each phase's clock starts when
the phase before it ends, not when the command made the bars."""

from __future__ import annotations

import io

from tqdm import tqdm

from edge_sdk.cli import _one_after_another


def test_a_later_phase_is_timed_from_when_the_one_before_it_ends():
    """Export showed "validating levels: 1/4 [01:41<05:03, 101.10s/layer]" for 15 s of validation: the validating
    bar's clock had run since the command started. The clocks are set to 0 here, as if made long ago."""
    shown = io.StringIO()
    bars = [
        tqdm(total=2, file=io.StringIO()),
        tqdm(total=4, file=io.StringIO(), disable=True),  # a phase that does not run
        tqdm(file=shown, delay=60),  # shown only after a minute of its own phase
    ]
    for bar in bars:
        bar.start_t = 0.0
    calibrated, _, written = _one_after_another(*bars)
    calibrated(0)
    assert bars[2].start_t == 0.0  # the first phase has not ended
    calibrated(1)
    assert bars[0].n == 2 and bars[2].start_t > 0.0  # writing (after a validation that does not run) starts now
    restarted = bars[2].start_t
    written("a")
    calibrated(2)  # a phase past its total restarts nothing
    assert bars[2].n == 1 and bars[2].start_t == restarted
    # its display delay restarted too: a quick phase draws nothing (a forced redraw put "writing tensors: 0tensor"
    # before the one line of a command stopped by SIGTERM)
    bars[2].close()
    assert shown.getvalue() == ""
    bars[0].close()


def test_bars_of_overlapping_phases_move_no_cursor(capsys):
    """A sweep opens a phase's bar while the one before it is still open (export makes all three at once): tqdm put
    each further bar one line down and came back with "\\x1b[A", which a log file (stderr not a terminal) showed as
    an empty line and an escape sequence per update."""
    from edge_sdk.cli import _phase_progress

    with _phase_progress() as report:
        report("svd: calibrating", 0, 2)
        report("svd: validating levels", 0, 2)
        for done in (1, 2):
            report("svd: calibrating", done, 2)
        for done in (1, 2):
            report("svd: validating levels", done, 2)
    shown = capsys.readouterr().err
    assert "\x1b[" not in shown and "\n\n" not in shown
    assert "svd: calibrating: 100%" in shown and "svd: validating levels: 100%" in shown
