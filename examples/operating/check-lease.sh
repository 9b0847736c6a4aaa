#!/bin/sh
# A monitoring check for a database's lease: exit 0 when some process holds
# it (the backend is up and alone), 1 when nobody does, 2 when the answer
# is not "one holder" (a split, unknown, a wrong path, an error).
# Usage: check-lease.sh DATABASE
db=${1:?usage: check-lease.sh DATABASE}
out=$(sidelease status "$db" 2>&1)
code=$?
case $code in
  3) echo "OK: $db is held";                    exit 0 ;;
  0) echo "WARNING: nobody holds $db";          exit 1 ;;
  4) echo "CRITICAL: split: $out";              exit 2 ;;
  5) echo "UNKNOWN: cannot tell: $out";         exit 2 ;;
  66) echo "CRITICAL: no such database: $db";   exit 2 ;;
  *) echo "CRITICAL: sidelease status exited $code: $out"; exit 2 ;;
esac
