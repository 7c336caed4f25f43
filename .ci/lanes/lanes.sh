# The CI lanes, as data: sourced by .ci/run (which runs them) and .ci/lanes/freeze (which pins them). Bash 4+.
#
# Every lane has torch==2.13.0 (CPU). Every lane but newest installs INSTALL[lane] with its constraints file
# .ci/constraints/LANE.txt (every package pinned, written by .ci/lanes/freeze) and runs TESTS[lane]; newest runs
# README's own quick-start commands instead. Tests that need a newer diffusers / transformers than a lane has carry
# diffusers_min / transformers_min markers and are deselected there (tests/conftest.py).
# shellcheck disable=SC2034  # read by the scripts that source this file

LANES=(newest locked oldest-0.11 oldest-0.14 oldest-dispatch oldest-cp)

declare -A ABOUT=(
  [newest]="the newest releases, resolved afresh by README's quick-start commands"
  [locked]="the tested set of .ci/constraints/locked.txt"
  [oldest-0.11]="diffusers 0.11.1 + transformers 4.25.1 (Tune-A-Video, AnimateDiff), huggingface_hub and accelerate at their minimums"
  [oldest-0.14]="diffusers 0.14.0 + transformers 4.30.2 (the cross_attention layout's projects)"
  [oldest-dispatch]="the oldest with diffusers' dispatcher (0.35.0) and CLIP through AttentionInterface (transformers 4.52.1)"
  [oldest-cp]="the oldest with context parallelism (diffusers 0.38.0) and T5 through AttentionInterface (transformers 5.15.0)"
)

TEST_TOOLS="pytest pytest-xdist hypothesis"
declare -A INSTALL=(
  [locked]="-e .[dev,diffusers]"
  [oldest-0.11]="-e .[diffusers] accelerate $TEST_TOOLS"
  [oldest-0.14]="-e .[diffusers] accelerate $TEST_TOOLS"
  [oldest-dispatch]="-e .[diffusers] accelerate peft $TEST_TOOLS"
  [oldest-cp]="-e .[diffusers] accelerate $TEST_TOOLS"
)

# What the oldest lanes run: the integration paths their versions are about, a CLIP text-to-image pipeline in each.
# The locked lane runs the whole suite and README's main job, as the newest lane does, on the tested set.
OLD_DIFFUSERS_TESTS="tests/integrations/test_legacy_attention.py tests/integrations/test_diffusers_compat.py \
tests/integrations/test_text_encoder_pipeline.py tests/runtime/test_activate.py tests/e2e/test_run_project.py \
tests/upstream tests/doctor/test_versions.py"
declare -A TESTS=(
  [locked]="tests"
  [oldest-0.11]="$OLD_DIFFUSERS_TESTS"
  [oldest-0.14]="$OLD_DIFFUSERS_TESTS"
  [oldest-dispatch]="tests/integrations/test_diffusers_integration.py tests/integrations/test_text_encoder_pipeline.py \
tests/strategy/test_handle_restore_order.py tests/strategy/test_strategy_runtime.py tests/upstream"
  [oldest-cp]="tests/parallel/test_context_parallel.py tests/parallel/test_backend.py \
tests/integrations/test_transformers_attention.py tests/integrations/test_text_encoder_pipeline.py tests/upstream"
)
# A pytest -m expression for a lane's tests (none: every test the version markers keep).
declare -A MARKERS=()
# Lanes that also run README's main job after their tests (its run part: the lane's venv is the install).
declare -A MAIN_JOB=(
  [locked]=1
)
# How the README's table names what each lane ran.
declare -A TESTS_SAID=(
  [newest]="whole suite + main job"
  [locked]="whole suite + main job"
  [oldest-0.11]="old-diffusers tests + CLIP pipeline"
  [oldest-0.14]="old-diffusers tests + CLIP pipeline"
  [oldest-dispatch]="dispatcher + CLIP pipeline"
  [oldest-cp]="context parallel + T5/CLIP"
)
# What each lane's constraints were resolved from (.ci/lanes/freeze LANE): the versions the lane is about, and the
# companions old releases need (diffusers < 0.26 needs huggingface_hub < 0.26; accelerate 0.20 imports pkg_resources,
# which the newest setuptools no longer ships).
declare -A PINNED_FROM=(
  [locked]="transformers==5.23.0"
  [oldest-0.11]="diffusers==0.11.1 transformers==4.25.1 huggingface_hub==0.10.0 accelerate==0.15.0"
  [oldest-0.14]="diffusers==0.14.0 transformers==4.30.2 huggingface_hub==0.25.2 accelerate==0.20.3 setuptools==80.9.0"
  [oldest-dispatch]="diffusers==0.35.0 transformers==4.52.1"
  [oldest-cp]="diffusers==0.38.0 transformers==5.15.0"
)
