# shellcheck shell=bash
# What the deploy tests share (source it): the prompt every deployed
# cluster answers, and the answer the in-process engine gives it.
DEPLOY_PROMPT="Name one colour of the sky."
DEPLOY_MAX_TOKENS=12

# The first line of `baton generate` run in-process (greedy): BIN MODEL.
reference_answer() {
  "$1/baton" generate --model="$2" --prompt="$DEPLOY_PROMPT" \
    --max_tokens="$DEPLOY_MAX_TOKENS" --temperature=0 2>/dev/null | head -n 1
}
