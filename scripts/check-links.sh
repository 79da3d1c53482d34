#!/usr/bin/env bash
# Checks the relative links of README.md and every markdown file under docs/: the file (or
# directory) a link names must exist, and a #fragment must be a heading of the page it points
# to (GitHub's anchors: lower case, punctuation dropped, spaces as hyphens). Links to web
# addresses are not followed. Prints each broken link as FILE:LINE: TARGET (why) and exits 1
# if there is any; run by `make check` and by objstore/dog/tests/docs.rs.
set -euo pipefail
cd "$(dirname "$0")/.."
export LC_ALL=C.UTF-8

# The anchors of a markdown file's headings, one a line (outside code blocks).
anchors() {
    awk '/^[[:space:]]*```/ { code = !code; next } !code && /^#+ / { sub(/^#+ +/, ""); print }' "$1" |
        tr '[:upper:]' '[:lower:]' |
        sed -E 's/[^[:alnum:] _-]//g; s/ /-/g'
}

broken=0
checked=0
while IFS= read -r file; do
    dir=$(dirname "$file")
    # Every [text](target) outside code blocks and inline code, with its line number.
    while IFS=$'\t' read -r line target; do
        checked=$((checked + 1))
        case "$target" in
        http://* | https://* | mailto:*) continue ;;
        esac
        path=${target%%#*}
        frag=
        [[ "$target" == *"#"* ]] && frag=${target#*#}
        if [ -z "$path" ]; then
            dest=$file
        else
            dest=$dir/$path
        fi
        if [ ! -e "$dest" ]; then
            echo "$file:$line: $target (no such file: $dest)"
            broken=$((broken + 1))
            continue
        fi
        if [ -n "$frag" ] && [[ "$dest" == *.md ]]; then
            if ! anchors "$dest" | grep -qxF -- "$frag"; then
                echo "$file:$line: $target (no heading #$frag in $dest)"
                broken=$((broken + 1))
            fi
        fi
    done < <(awk '
        /^[[:space:]]*```/ { code = !code; next }
        code { next }
        {
            s = $0
            gsub(/`[^`]*`/, "", s)
            while (match(s, /\]\([^) ]+\)/)) {
                printf "%d\t%s\n", NR, substr(s, RSTART + 2, RLENGTH - 3)
                s = substr(s, RSTART + RLENGTH)
            }
        }' "$file")
done < <(
    echo README.md
    find docs -name '*.md' | sort
)

if [ "$broken" -ne 0 ]; then
    echo "check-links: $broken broken link(s) of $checked" >&2
    exit 1
fi
if [ "$checked" -eq 0 ]; then
    echo "check-links: found no links at all: the parser is broken" >&2
    exit 1
fi
echo "check-links: $checked link(s), none broken"
