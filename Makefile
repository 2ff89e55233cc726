# `make run` and `make test` each do the whole set-up first; stamps make a second call skip it.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
CONSTRAINTS := .ci/constraints.txt
APT_PACKAGES := openmpi-bin libopenmpi-dev cmake g++ make slurm-wlm munge libfuse2
RUN_RANKS ?= 2
RUN_MINUTES ?= 30
RUN_JOB ?= jobs/pong-ppo.toml
RUN_REFERENCE ?= pong
RUN_STAMP := $(shell date +%Y%m%d-%H%M%S)
RUN_OUT ?= runs/pong-$(RUN_STAMP)
export OMPI_MCA_rmaps_base_oversubscribe := 1
# The newest stack (Python 3.13, the newest TensorFlow, numpy 2; no Horovod) in a venv of its
# own, for `make test-newest`; pyenv's 3.13 by default.
NEWEST_PYTHON ?= $(lastword $(wildcard $(HOME)/.pyenv/versions/3.13*/bin/python3))
NEWEST_VENV := .venv-newest
NEWEST_PY := $(NEWEST_VENV)/bin/python
comma := ,

.PHONY: setup run test test-newest docs bench clean-venv

setup: $(VENV)/.horovod

# Debian packages: installed only when one is missing, so a second call costs a dpkg query.
$(VENV)/.apt:
	@missing=$$(for p in $(APT_PACKAGES); do dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages: $$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi
	@mkdir -p $(VENV) && touch $@

# A venv with ddrl and the extras named: $(call venv_recipe,PYTHON,VENV,CONSTRAINTS,EXTRAS).
define venv_recipe
	@[ -x $(2)/bin/python ] || $(1) -m venv $(2)
	$(2)/bin/python -m pip install -q --upgrade pip setuptools wheel
	$(2)/bin/python -m pip install -q -c $(3) -e '.[$(4)]'
	@touch $@
endef

$(VENV)/.deps: $(VENV)/.apt setup.cfg pyproject.toml $(CONSTRAINTS)
	$(call venv_recipe,python3,$(VENV),$(CONSTRAINTS),test)

# Horovod compiles against the installed TensorFlow and MPI (2-5 minutes on 2 cores), so the
# stamp holds the TensorFlow it was built against: a venv whose TensorFlow changed (a new
# constraints file) rebuilds it, since its compiled operations are tied to that TensorFlow.
# Without Gloo: ddrl's launchers (mpirun, srun) start Horovod on MPI, and Gloo's sources are
# a third of the build (docs/install.md).
$(VENV)/.horovod: $(VENV)/.deps
	@tf=$$($(PY) -c 'import importlib.metadata as m; print(m.version("tensorflow"))'); \
	if [ "$$(cat $@ 2>/dev/null)" != "$$tf" ] || ! $(PY) -c 'import horovod.tensorflow' 2>/dev/null; then \
	  echo "building Horovod against TensorFlow $$tf and Open MPI (2-5 minutes on 2 cores)"; \
	  $(PIP) uninstall -q -y horovod 2>/dev/null; \
	  HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITHOUT_GLOO=1 \
	  HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS=-j2 \
	  $(PIP) install -q --no-cache-dir --no-build-isolation -c $(CONSTRAINTS) horovod || exit 1; \
	fi; echo "$$tf" > $@

# The main job: the Pong recipe on 2 ranks until its target score or RUN_MINUTES, then the
# summary of its log and its curves beside the published scores. Each rank bound to its share
# of the cores, as ddrl's benchmarks and sweeps start them (the command is echoed).
run: setup
	@launch=$$($(PY) -m ddrl.distributed.launch $(RUN_RANKS)) && set -x && \
	  $$launch $(VENV)/bin/ddrl train $(RUN_JOB) \
	  --out $(RUN_OUT) --set run.max_minutes=$(RUN_MINUTES) --set run.checkpoint_minutes=2
	$(VENV)/bin/ddrl analyze $(RUN_OUT) --reference $(RUN_REFERENCE)

# The in-process tiers first (unit, then integration over fakes): a broken formula or loop
# fails in seconds, before any mpirun. Every tier runs two tests at a time: one end-to-end
# test alone leaves a core idle while it waits (start-up, timeouts, daemons), two keep both
# busy (a third ran no faster); a module whose fixtures train or start a cluster stays on one
# worker (its xdist_group). Then the newest stack's leg.
PYTEST_PARALLEL = -n 2
test: setup
	$(PY) -m ruff check .
	$(PY) -m pytest -q $(PYTEST_PARALLEL) tests/unit tests/integration
	$(MAKE) --no-print-directory docs
	$(PY) -m pytest -q $(PYTEST_PARALLEL) --dist loadgroup --durations=40 tests --ignore=tests/unit --ignore=tests/integration
	$(MAKE) --no-print-directory test-newest

$(NEWEST_VENV)/.deps: setup.cfg pyproject.toml .ci/constraints-newest.txt $(VENV)/.apt
	@[ -n "$(NEWEST_PYTHON)" ] || { echo "ddrl: error: no Python 3.13 found under ~/.pyenv/versions; set NEWEST_PYTHON=/path/to/python3.13" >&2; exit 2; }
	$(call venv_recipe,$(NEWEST_PYTHON),$(NEWEST_VENV),.ci/constraints-newest.txt,test$(comma)wandb)

# The unit and integration tiers and the end-to-end tests marked `newest_stack` (two ranks
# under mpirun, an Atari game, a resume, the installed wheel, W&B offline) on the newest stack.
test-newest: $(NEWEST_VENV)/.deps
	$(NEWEST_PY) -m pytest -q $(PYTEST_PARALLEL) tests/unit tests/integration
	$(NEWEST_PY) -m pytest -q $(PYTEST_PARALLEL) --dist loadgroup -m newest_stack tests --ignore=tests/unit --ignore=tests/integration

# The documentation site (docs/, mkdocs.yml) into site/; --strict fails on a broken link.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

bench: setup
	$(VENV)/bin/ddrl bench node jobs/pong.toml

clean-venv:
	rm -rf $(VENV) $(NEWEST_VENV)
