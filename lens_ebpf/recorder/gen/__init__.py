"""Generated from protos/prometheus/v1 and v2 (remote write) by scripts/gen_protos.sh; do not edit."""
