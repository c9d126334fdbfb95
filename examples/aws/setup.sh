#!/usr/bin/env bash
# setup.sh — prepares moto (started by `scripts/emulators/start.sh moto`) for
# examples/aws the way an AWS account would be: signature checks on, an IAM user whose access
# key Sluice signs with, the FIFO queue and the bucket. Prints the key as export lines:
#
#   eval "$(examples/aws/setup.sh)"        # MOTO_URL defaults to $SLUICE_EMU_MOTO_URL
#
# moto checks no signature unless told to: POST /moto-api/reset-auth makes the next 3 calls
# (creating the user, its key and its policy) the last unchecked ones. Everything after them,
# Sluice's calls included, must be signed with that key, or moto answers 403. Empties moto
# first (POST /moto-api/reset). Needs curl 7.75 or newer (--aws-sigv4).
set -euo pipefail
url="${MOTO_URL:-${SLUICE_EMU_MOTO_URL:-http://127.0.0.1:5000}}"
region=us-east-1

curl -fsS -o /dev/null -X POST "$url/moto-api/reset"
curl -fsS -o /dev/null -X POST "$url/moto-api/reset-auth" -H 'content-type: text/plain' --data-binary 3

# iam ACTION [NAME=VALUE ...] — an IAM query call signed with a key nobody checks yet.
iam() {
  local args=(--data-urlencode "Action=$1" --data-urlencode Version=2010-05-08)
  shift
  for pair in "$@"; do args+=(--data-urlencode "$pair"); done
  curl -fsS --aws-sigv4 "aws:amz:$region:iam" --user "AKIDSETUP:unchecked" "${args[@]}" "$url/"
}
iam CreateUser UserName=sluice >/dev/null
key="$(iam CreateAccessKey UserName=sluice)"
iam PutUserPolicy UserName=sluice PolicyName=everything \
  'PolicyDocument={"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}' >/dev/null
access="$(sed -n 's:.*<AccessKeyId>\(.*\)</AccessKeyId>.*:\1:p' <<<"$key")"
secret="$(sed -n 's:.*<SecretAccessKey>\(.*\)</SecretAccessKey>.*:\1:p' <<<"$key")"
[ -n "$access" ] && [ -n "$secret" ] || { echo "setup.sh: no access key in: $key" >&2; exit 1; }

# From here on moto checks every signature.
curl -fsS -o /dev/null --aws-sigv4 "aws:amz:$region:sqs" --user "$access:$secret" \
  -H 'content-type: application/x-amz-json-1.0' -H 'x-amz-target: AmazonSQS.CreateQueue' \
  -d '{"QueueName": "orders.fifo", "Attributes": {"FifoQueue": "true"}}' "$url/"
# S3 wants the payload's hash signed: that of an empty body.
curl -fsS -o /dev/null --aws-sigv4 "aws:amz:$region:s3" --user "$access:$secret" -X PUT \
  -H 'x-amz-content-sha256: e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855' \
  "$url/sluice-reports"
echo "moto at $url checks signatures now; the queue orders.fifo and the bucket sluice-reports exist" >&2
echo "export AWS_ACCESS_KEY_ID=$access AWS_SECRET_ACCESS_KEY=$secret"
