"""Scripts run one after another in one session (`in_sequence`): each keeps its own bash, the first failure stops."""

from __future__ import annotations

import subprocess

from components.bash import in_sequence, script


def run(text: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-s"], input=text, capture_output=True, text=True)


def test_parts_run_in_order_each_with_its_own_change_count():
    a = script("first", "h1", 'changed "one"\nchanged "two"\n')
    b = script("second", "h1", 'echo "$CHANGES before"\nchanged "three"\n')
    out = run(in_sequence("both", [a, b]))
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["h1: changed: one", "h1: changed: two", "h1: 2 change(s)",
                                       "0 before", "h1: changed: three", "h1: 1 change(s)"]


def test_a_failing_part_stops_the_parts_after_it():
    a = script("first", "h1", 'fail "no NIC"\n')
    b = script("second", "h1", 'changed "must not run"\n')
    out = run(in_sequence("both", [a, b]))
    assert out.returncode == 1 and "h1: error: no NIC" in out.stderr and "must not run" not in out.stdout


def test_a_part_holding_the_marker_cannot_end_its_heredoc_early():
    a = script("first", "h1", "cat >/dev/null <<'X'\nGPUCLUSTER_PART\nX\nchanged one\n")
    out = run(in_sequence("both", [a, script("second", "h1", "")]))
    assert out.returncode == 0 and out.stdout.count("change(s)") == 2, out.stdout + out.stderr


def test_one_script_is_left_as_it_is():
    a = script("only", "h1", "true\n")
    assert in_sequence("one", [a]) == a


def test_with_stdin_each_part_is_named_gpucluster_and_the_first_reads_the_session_input():
    from components.ssh import as_command

    a = script("first", "h1", 'read -r secret\nnote "got ${#secret} characters as $0"\n')
    b = script("second", "h1", 'note "then as $0"\n')
    command = as_command(in_sequence("both", [a, b], stdin=True), "root", stdin=True)
    out = subprocess.run(["bash", "-c", command], input="s3cret\n", capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "h1: got 6 characters as gpucluster" in out.stdout and "h1: then as gpucluster" in out.stdout
    assert "s3cret" not in out.stdout + out.stderr
