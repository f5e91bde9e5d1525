"""User code is imported and its signature checked before Ray starts; leaving by ``sys.exit`` or Ctrl-C is one line.

Each case writes the user's file into ``tmp_path`` and composes ``main_ppo``'s config in-process as the
command line does (config loading imports plugins and loads the custom reward function); one case
runs the real command.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from one_line_errors import cli_refusal, one_line_error

from rlflow.errors import UserError
from rlflow.rewards.scoring import RewardInput, score_one
from rlflow.trainer.entry_points import compose_ppo_config
from rlflow.utils.plugins import load_module_file

WRONG_SIGNATURE = "def score(solution_str, ground_truth):\n    return 1.0\n"
EXITS_ON_IMPORT = "import sys\nsys.exit(0)\ndef score(data_source, solution_str, ground_truth, extra_info):\n    return 1.0\n"
INTERRUPTED_IMPORT = "raise KeyboardInterrupt\n"
BAD_REGISTERED_REWARD = ("from rlflow.rewards import REWARD_REGISTRY\n\n"
                         "@REWARD_REGISTRY.register('user/bad-signature')\ndef score(solution_str):\n    return 1.0\n")
EXITS_WHEN_CALLED = "import sys\ndef score(data_source, solution_str, ground_truth, extra_info):\n    sys.exit(0)\n"


def _file(tmp_path: Path, text: str, name: str = "user_code.py") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize("text, words", [
    (WRONG_SIGNATURE, "takes (solution_str, ground_truth), but rewards are called as fn(data_source, solution_str, "
                      "ground_truth, extra_info)"),
    (EXITS_ON_IMPORT, "failed: SystemExit: 0"),
])
def test_a_custom_reward_is_loaded_and_checked_in_config_loading(tmp_path, text, words):
    path = _file(tmp_path, text)
    message = one_line_error(compose_ppo_config, [f"reward.custom_function={path}:score"])
    assert message.startswith("config key 'reward.custom_function': ") and str(path) in message and words in message


@pytest.mark.parametrize("text, words", [
    (INTERRUPTED_IMPORT, "failed to import: KeyboardInterrupt"),
    (BAD_REGISTERED_REWARD, "RewardSignatureError: reward function score"),
])
def test_a_plugin_leaving_by_base_exception_or_registering_a_bad_reward_is_one_line(tmp_path, text, words):
    path = _file(tmp_path, text, f"plugin_{len(text)}.py")
    message = one_line_error(compose_ppo_config, [f"trainer.plugins=[{path}]"])
    assert f"plugin {path} " in message and words in message


def test_sys_exit_while_scoring_is_a_user_error_naming_the_file(tmp_path):
    fn = load_module_file(_file(tmp_path, EXITS_WHEN_CALLED)).score
    with pytest.raises(UserError, match=r"reward function score \(.*user_code\.py\) raised SystemExit\(0\) while scoring"):
        score_one(fn, RewardInput("ds", "text", "1", {}), error_score=0.0)


def test_the_cli_refuses_a_reward_module_that_exits_before_ray(tmp_path):
    path = _file(tmp_path, EXITS_ON_IMPORT)
    line = cli_refusal(["-m", "rlflow.trainer.main_ppo", f"reward.custom_function={path}:score",
                        f"trainer.ray_temp_dir={tmp_path / 'ray'}", f"trainer.default_local_dir={tmp_path / 'run'}"],
                       ray_dir=tmp_path / "ray")
    assert str(path) in line and "SystemExit" in line
    assert not (tmp_path / "run").exists()
