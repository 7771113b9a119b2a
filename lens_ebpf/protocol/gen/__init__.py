"""Generated from protos/lens/v1/lens.proto by scripts/gen_protos.sh; do not edit."""
