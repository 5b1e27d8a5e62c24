# `make docs` (HTML reference and guides) and `make ee` (execution-environment build context).
# Included from the Makefile after its variables (VENV, BIN, PYTHON, STAMP, COLLECTIONS):
#     include docs/docs.mk
# Until then: make -f Makefile -f docs/docs.mk docs

DOCS_STAMP  := $(VENV)/.docs-requirements.sha256
DOCS_BUILD  := $(CURDIR)/docs/build
DOCS_SITE   := $(DOCS_BUILD)/rst
DOCS_SOURCE := $(DOCS_SITE)/rst
DOCS_HTML   := $(DOCS_BUILD)/html
EE_SOURCE   := $(CURDIR)/build/ee-src
EE_CONTEXT  := $(CURDIR)/build/ee
# antsibull-docs runs ansible, ansible-doc and ansible-galaxy: the venv's, on the checkout linked into COLLECTIONS.
DOCS_ENV    := PATH="$(BIN):$$PATH" ANSIBLE_COLLECTIONS_PATH="$(COLLECTIONS)"
# Builds run offline: no intersphinx inventories, so references into docs.ansible.com render as plain text
# (ref.ref); references inside the collection are checked by antsibull-docs' lint in check_rendered.py.
SPHINX_OPTS := -q -W --keep-going \
               -D extensions=sphinx.ext.autodoc,sphinx_antsibull_ext,myst_parser \
               -D myst_heading_anchors=3 -D suppress_warnings=ref.ref

.PHONY: docs docs-venv ee

docs-venv: $(DOCS_STAMP)

$(DOCS_STAMP): $(STAMP) docs/requirements.txt
	$(PYTHON) -m pip install --quiet -r docs/requirements.txt
	sha256sum docs/requirements.txt > $@

docs: docs-venv collection-link ## HTML module/role reference and guides in docs/build/html; fails on any page that does not render
	rm -rf $(DOCS_BUILD)
	mkdir -p $(DOCS_SITE) && chmod og-w $(DOCS_SITE)  # antsibull-docs writes only into a directory no one else can
	$(DOCS_ENV) $(BIN)/antsibull-docs sphinx-init --use-current --lenient --dest-dir $(DOCS_SITE) \
	  --project llmops.inference --title 'llmops.inference' --copyright 'llmops.inference maintainers' \
	  --index-rst-source docs/site/index.rst llmops.inference >/dev/null
	chmod og-w $(DOCS_SOURCE)
	$(DOCS_ENV) $(BIN)/antsibull-docs --config-file $(DOCS_SITE)/antsibull-docs.cfg collection --use-current \
	  --fail-on-error --cleanup everything --dest-dir $(DOCS_SOURCE) llmops.inference
	$(PYTHON) docs/site/stage_guides.py docs $(DOCS_SOURCE)/guide
	$(BIN)/sphinx-build $(SPHINX_OPTS) -b html -c $(DOCS_SITE) $(DOCS_SOURCE) $(DOCS_HTML)
	$(DOCS_ENV) $(PYTHON) docs/check_rendered.py --collection . --html $(DOCS_HTML)
	@echo "docs: open $(DOCS_HTML)/index.html"

ee: docs-venv ## Execution-environment build context in build/ee (ansible-builder create; no container engine needed)
	rm -rf $(EE_SOURCE) $(EE_CONTEXT)
	$(BIN)/ansible-galaxy collection build --force --output-path $(EE_SOURCE) . >/dev/null
	mv $(EE_SOURCE)/llmops-inference-*.tar.gz $(EE_SOURCE)/llmops-inference.tar.gz
	$(BIN)/ansible-builder create --file execution-environment.yml --context $(EE_CONTEXT) --output-filename Containerfile
	$(PYTHON) tests/ee/check_context.py --context $(EE_CONTEXT) --definition execution-environment.yml
	@echo "ee: build the image with: podman build --tag llmops-inference-ee $(EE_CONTEXT)"
