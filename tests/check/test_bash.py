"""The restricted bash reader: the forms Megatron-LM's example scripts use (docs/research/megatron.md
sec. 7), each checked against what bash itself does."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from planner.check.bash import run_script
from planner.errors import InputError


def _argv(tmp_path, text: str, args=None) -> list[list[str]]:
    p = tmp_path / "s.sh"
    p.write_text(text)
    return [c.words() for c in run_script(p, args).commands]


def _bash(tmp_path, text: str) -> list[str] | None:
    """What bash passes to the last command (printed one word per line), for comparison."""
    if shutil.which("bash") is None:
        return None
    p = tmp_path / "b.sh"
    p.write_text("run() { printf '%s\\n' \"$@\"; }\n" + text.replace("torchrun", "run"))
    return subprocess.run(["bash", str(p)], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"}).stdout.splitlines()


CASES = [
    # arrays over lines with comments, unquoted expansion splits multi-word elements, quotes inside values stay
    ('A=(\n  --x 1 # comment\n  "--y 2"\n  "--split \'99,1,0\'"\n)\ntorchrun ${A[@]}\n',
     ["--x", "1", "--y", "2", "--split", "'99,1,0'"]),
    # defaults, arithmetic, positional defaults
    ('N=${N:-2}\nG=8\nW=$(($G*$N))\nP=${1:-"a b"}\ntorchrun --w $W "$P"\n', ["--w", "16", "a b"]),
    # += appends, quoted [@] keeps elements, empty quoted array vanishes
    ('A=(--a)\nA+=(--b "c d")\nE=()\ntorchrun "${E[@]}" "${A[@]}"\n', ["--a", "--b", "c d"]),
    # if/elif with [ ] and [[ ]], || chains
    ('M=2B\nif [ ${M} == "1B" ]; then X=1\nelif [[ "$M" == "2B" ]] || [[ -z "$M" ]]; then X=2\nelse X=3\nfi\ntorchrun $X\n', ["2"]),
    # backslash continuations inside an array and a double-quoted string with backslash-newline
    ('A=(\n  --a 1 \\\n  --b 2\n)\nS="--c \\\n  3"\ntorchrun ${A[@]} $S\n', ["--a", "1", "--b", "2", "--c", "3"]),
    # ${VAR%/*}, ${#ARR[@]}, case
    ('P=/x/y/z.py\nA=(1 2 3)\ncase $P in *.py) K=py;; *) K=no;; esac\ntorchrun ${P%/*} ${#A[@]} $K\n', ["/x/y", "3", "py"]),
]


@pytest.mark.parametrize("text,expected", CASES)
def test_expansion_matches_bash(tmp_path, text, expected):
    got = _argv(tmp_path, text)[-1][1:]
    assert got == expected
    real = _bash(tmp_path, text)
    if real is not None:
        assert real == expected


def test_bash_c_and_heredoc_are_read_again(tmp_path):
    text = ('ARGS=(--a 1 --b 2)\nCMD="python train.py ${ARGS[@]}"\n'
            'sbatch <<EOF\n#SBATCH --nodes=4\n#SBATCH --ntasks-per-node=8\nsrun bash -c "${CMD}"\nEOF\n')
    p = tmp_path / "s.sh"
    p.write_text(text)
    sh = run_script(p)
    cmd = sh.commands[-1]
    assert cmd.words() == ["python", "train.py", "--a", "1", "--b", "2"]
    kinds = [k for k, _ in cmd.context]
    assert kinds == ["sbatch", "srun"] and cmd.context[0][1]["nodes"] == "4"
    # every word knows the line it was written on, through the re-parsed string
    assert cmd.argv[3][0].origin.line == 1 and cmd.argv[3][0].origin.file == str(p)


def test_source_and_functions(tmp_path):
    (tmp_path / "conf.sh").write_text('export PARAMS=" --tp ${TP} \\\n  --pp 2"\n')
    text = 'TP=4\n. `pwd`/conf.sh\nlaunch() { torchrun "$@"; }\nlaunch $PARAMS\n'
    assert _argv(tmp_path, text)[-1] == ["torchrun", "--tp", "4", "--pp", "2"]


def test_template_placeholders_do_not_stop_the_reader(tmp_path):
    text = 'export PART=<slurm partition, used to feed -p option>\nX=1\ntorchrun $X\n'
    assert _argv(tmp_path, text)[-1] == ["torchrun", "1"]


@pytest.mark.parametrize("text", ['A="unclosed\n', "A=(1 2\n", "if true; then\n  X=1\n", "echo $((1 +* 2))\n"])
def test_broken_shell_is_one_line_error(tmp_path, text):
    p = tmp_path / "bad.sh"
    p.write_text(text)
    with pytest.raises(InputError) as e:
        run_script(p)
    assert "\n" not in str(e.value) and "bad.sh" in str(e.value)


def test_a_nested_sbatch_sets_its_own_node_count(tmp_path):
    """The outer batch script's #SBATCH --nodes sets SLURM_NNODES for itself; an sbatch --nodes it
    submits sets its own for the inner script."""
    from planner.check import read_job  # noqa: PLC0415

    (tmp_path / "inner.sh").write_text("#!/bin/bash\ntorchrun --nnodes $SLURM_NNODES --nproc_per_node 8 pretrain_gpt.py --num-layers 32 "
                                       "--hidden-size 4096 --num-attention-heads 32 --seq-length 4096 --max-position-embeddings 4096 "
                                       "--micro-batch-size 1 --global-batch-size 64 --bf16\n")
    (tmp_path / "outer.sh").write_text("#!/bin/bash\n#SBATCH --nodes=1\nsbatch --nodes=4 inner.sh\n")
    assert read_job([str(tmp_path / "outer.sh")]).cluster.num_gpus == 32


def test_sbatch_wrap_and_attached_short_options(tmp_path):
    """sbatch --wrap "CMD" runs CMD as the batch script; #SBATCH -N4 is -N 4."""
    from planner.check import read_job  # noqa: PLC0415

    cmd = ("torchrun --nnodes $SLURM_NNODES --nproc_per_node 8 pretrain_gpt.py --num-layers 32 --hidden-size 4096 "
           "--num-attention-heads 32 --seq-length 4096 --max-position-embeddings 4096 --micro-batch-size 1 --global-batch-size 64 --bf16")
    (tmp_path / "wrap.sh").write_text('#!/bin/bash\nsbatch --nodes=4 --wrap "' + cmd.replace("$", "\\$") + '"\n')
    assert read_job([str(tmp_path / "wrap.sh")]).cluster.num_gpus == 32
    (tmp_path / "short.sbatch").write_text("#!/bin/bash\n#SBATCH -N4\n" + cmd + "\n")
    assert read_job([str(tmp_path / "short.sbatch")]).cluster.num_gpus == 32
