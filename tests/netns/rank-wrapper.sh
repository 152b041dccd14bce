#!/bin/sh
# Exec wrapper for `weft run`: runs rank WEFT_RANK on "host" (network namespace) weft-hH,
# H = 0 for the first half of the ranks and 1 for the others, on that host's interface. The
# start-up channel (WEFT_BOOT_FD) stays open through `ip netns exec`.
h=$(( WEFT_RANK * 2 / WEFT_SIZE ))
export WEFT_OFI_DOMAIN=weftv$h
exec ip netns exec "weft-h$h" "$@"
