"""Command-line overrides against the schema: a typo is refused with the key meant named."""

from __future__ import annotations

import pytest

from pdbench.config.overrides import OverrideError, check_overrides, closest, combinations

pytestmark = pytest.mark.unit


def refused(*args: str) -> str:
    with pytest.raises(OverrideError) as info:
        check_overrides(list(args))
    assert len(info.value.problems) == 1, info.value.problems
    return info.value.problems[0]


def test_an_unknown_key_names_the_key_meant():
    line = refused("dry_run=true")
    assert line.startswith("dry_run=true: dry_run is not a pdbench setting")
    assert "did you mean launch.dry_run?" in line
    assert line.endswith("Fix: launch.dry_run=true")


def test_a_plus_does_not_smuggle_an_unknown_key_in():
    line = refused("+dry_run=true")
    assert "did you mean launch.dry_run?" in line
    assert "the key would be dropped and the run start without it" in line


@pytest.mark.parametrize(
    ("arg", "meant"),
    [
        ("dryrun=true", "launch.dry_run"),
        ("workload.turn=3", "workload.turns"),
        ("sever.block_size=64", "server.block_size"),
        ("modle=llama3_8b", "model"),  # the value is a model preset: the group is meant
    ],
)
def test_misspelt_keys_get_one_suggestion(arg, meant):
    value = arg.split("=", 1)[1]
    assert refused(arg).endswith(f"did you mean {meant}? Fix: {meant}={value}")


def test_an_ambiguous_key_lists_the_candidates_without_guessing_a_fix():
    line = refused("tp=2")
    assert "topology.prefill.tp, topology.decode.tp or topology.agg.tp?" in line
    assert "Fix: name the key meant" in line


def test_a_setting_that_exists_is_set_without_a_plus():
    assert refused("+launch.dry_run=true").endswith("without the plus. Fix: launch.dry_run=true")


def test_a_map_given_whole_with_a_plus_is_told_the_double_plus_that_adds_its_keys():
    # without the plus Hydra refuses keys the map does not have yet ("not in struct")
    line = refused("+server.env={VLLM_LOGGING_LEVEL:DEBUG}")
    assert line.endswith("++ adds these keys to it. Fix: ++server.env={VLLM_LOGGING_LEVEL:DEBUG}")
    assert len(check_overrides(["++server.env={VLLM_LOGGING_LEVEL:DEBUG}"])) == 1


def test_groups_the_defaults_pick_take_no_plus_and_experiments_need_one():
    assert refused("+cluster=slurm").endswith("set it without the plus. Fix: cluster=slurm")
    assert refused("experiment=smoke").endswith("is added with a plus. Fix: +experiment=smoke")


def test_a_misspelt_preset_names_the_preset_and_the_choices():
    line = refused("cluster=slurmm")
    assert "no cluster preset 'slurmm'" in line and "did you mean slurm?" in line
    assert "Choices: debug, h100_8gpu, local, slurm" in line
    assert "did you mean smoke?" in refused("+experiment=smok")


def test_schemas_are_not_presets():
    line = refused("cluster=base_cluster")
    assert "no cluster preset 'base_cluster'" in line and "base_cluster," not in line


def test_every_value_of_a_sweep_is_checked():
    line = refused("topology=1p1d,p2d4")
    assert "no topology preset 'p2d4'" in line and "did you mean p2_d4?" in line


def test_enum_values_are_checked_by_name():
    commands = "run, status, transfer_bench, preflight, serve, stop"
    assert f"'bogus' is not one of {commands};" in refused("command=bogus")
    assert "did you mean slurm?" in refused("cluster.executor=slrm")


def test_every_problem_is_listed_at_once():
    with pytest.raises(OverrideError) as info:
        check_overrides(["dry_run=true", "cluster=slurmm"])
    assert str(info.value).startswith("2 problem(s) on the command line:\n")


@pytest.mark.parametrize(
    "args",
    [
        ["+experiment=smoke", "launch.dry_run=true"],
        ["+cluster.env.FOO=1", "server.env.BAR=2", "+cluster.additional_parameters.gres=x"],
        ["hydra.verbose=true", "hydra/job_logging=stdout"],
        ["workload.history_tokens.0=5", "~launch.dry_run"],
        ["topology=1p1d,p2_d4", "cluster=null"],
        ["launch=\\{dry_run:true\\}"],
    ],
)
def test_legitimate_overrides_pass(args):
    assert len(check_overrides(args)) == len(args)


def test_a_sweep_expands_as_hydra_does():
    parsed = check_overrides(["+experiment=crossover", "topology=1p1d,p2_d4", "name=a,b"])
    jobs = combinations(parsed)
    assert len(jobs) == 4
    assert jobs[0] == ["+experiment=crossover", "topology=1p1d", "name=a"]
    assert jobs[-1] == ["+experiment=crossover", "topology=p2_d4", "name=b"]


def test_closest_prefers_the_same_last_component():
    assert closest("dry_run", ["launch.dry_run", "launch.resume", "name"]) == ["launch.dry_run"]
    assert closest("zzz", ["launch.dry_run"]) == []


def test_a_key_given_twice_is_refused_not_silently_overwritten():
    with pytest.raises(OverrideError) as info:
        check_overrides(["+experiment=crossover", "+experiment=smoke"])
    (line,) = info.value.problems
    assert line.startswith("+experiment=crossover and +experiment=smoke: one key given twice")


@pytest.mark.parametrize(
    ("arg", "quoted"),
    [
        ("name=ünïcode", "'name=\"ünïcode\"'"),
        ("bench.tp_splits=[2->1]", "'bench.tp_splits=[\"2->1\"]'"),
        ("bench.tp_splits=[1->1,1->2]", '\'bench.tp_splits=["1->1","1->2"]\''),
        ("cluster.container_image=nvcr.io#nvidia/pytorch:25.01-py3", "'cluster.container_image="),
    ],
)
def test_a_lexer_failure_gets_the_quoted_form_that_parses(arg, quoted):
    line = refused("+experiment=smoke", arg)
    assert line.startswith("LexerNoViableAltException: ")
    fix = line.splitlines()[-1]
    assert fix.startswith("Fix: quote the ") and quoted in fix, line
    given = fix.split("'")[1]  # what the shell hands Hydra
    if not arg.startswith("cluster."):
        check_overrides(["+experiment=smoke", given])  # parses (keys checked too)
