"""run.sh's tiny run of the SAC and TD3 pairs, which is the same: the results line and every flag combination of the
twins (test_scripts.py's checks; test_speedup_table.py finds them here). The rest of what both pairs share is tested in
test_scripts.py, what is each algorithm's own in test_sac.py and test_td3.py."""

import pytest
from test_scripts import (
    PAIRS,
    TINY_RUN,
    check_plain_results_line_is_appended,
    check_twin_runs_with_every_flag_combination,
)

assert PAIRS["sac"].tiny == PAIRS["td3"].tiny == TINY_RUN


@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_plain_results_line_is_appended(algo, tmp_path):
    check_plain_results_line_is_appended(PAIRS[algo], tmp_path)


@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_twin_runs_with_every_flag_combination_and_appends_results(algo, tmp_path):
    check_twin_runs_with_every_flag_combination(PAIRS[algo], tmp_path)
