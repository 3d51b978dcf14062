# The two quick-start commands are `make demo` (the main job) and `make test`;
# both start the local services first (scripts/services.sh: Postgres,
# Temporal, Docker images), installing what is missing. `make up` starts the
# system without the demo.

SHELL := /bin/bash
export CGO_CFLAGS ?= -O2 -Wno-deprecated-declarations
STATE ?= $(CURDIR)/.flywheel
SERVICES := scripts/services.sh
ENV := eval "$$($(SERVICES) env)"

MINUTES ?= 10
# TASK=tools runs the multi-turn, tool-using task instead of the letters.
TASK ?= letters
ifeq ($(TASK),tools)
DEMO_MODEL ?= flywheel-demo-tools
DEMO_BASE := demo-tools
else
DEMO_MODEL ?= flywheel-demo
DEMO_BASE := demo
endif

.PHONY: up demo down services test test-short vet lint bench status

## up: start the services and `flywheel up` in the background; prints URLs and an API key
up: services
	@$(ENV); scripts/up.sh start

## demo: the main job: the services, `flywheel up` serving the demo's policy
## (restarted if it runs with another), then demo agents for MINUTES minutes
## on the TASK (letters, or tools: `make demo TASK=tools`)
## while the control plane trains, gates and releases on its own
demo: services
	@scripts/up.sh stop >/dev/null || true
	@$(ENV); FLYWHEEL_POLICY_BASE=$(DEMO_BASE) FLYWHEEL_GATEWAY_POLICY_MODEL=$(DEMO_MODEL) FLYWHEEL_CONTROL_WATCHDOG_EVERY=20s scripts/up.sh start
	@FLYWHEEL_GATEWAY_POLICY_MODEL=$(DEMO_MODEL) $(STATE)/bin/flywheel demo --task $(TASK) --minutes $(MINUTES) \
		--base-url http://127.0.0.1:8080 --api-key "$$(cat $(STATE)/data/dev-api-key)" --out $(STATE)/demo

## down: stop flywheel and the services
down:
	@scripts/up.sh stop || true
	@$(SERVICES) down

services:
	@$(SERVICES) up

status:
	@$(SERVICES) status; scripts/up.sh status || true

## test: vet, workflowcheck and every test against the real services
test: services vet
	@$(ENV); export FLYWHEEL_REQUIRE_SERVICES=1 FLYWHEEL_TEST_REPORT=$(STATE)/test-report.log; rm -f $$FLYWHEEL_TEST_REPORT; \
	go test -count=1 -timeout 70m ./... 2>&1 | tee $(STATE)/test.log | grep -v '^ok\|no test files' ; \
	status=$${PIPESTATUS[0]}; grep -E '^(ok|FAIL|---)' $(STATE)/test.log | tail -60; \
	if [ -s $$FLYWHEEL_TEST_REPORT ]; then echo "learning runs:"; cat $$FLYWHEEL_TEST_REPORT; fi; \
	pass=$$(grep -cE '^ok\s' $(STATE)/test.log); fail=$$(grep -E '^FAIL\s' $(STATE)/test.log | sort -u | wc -l); \
	echo "packages: $$pass passed, $$fail failed"; exit $$status

vet:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { echo "gofmt needed:"; gofmt -l $$(git ls-files '*.go'); exit 1; }
	go vet ./...
	go tool workflowcheck ./workflows/...
	@if command -v docker-compose >/dev/null; then FLYWHEEL_GATEWAY_ADMIN_KEY=compose-config-check-key docker-compose config -q && echo "docker-compose.yml ok"; fi
