#!/bin/sh
# SeaweedFS for the day0 compose stack: master, volume, filer and S3 gateway in one process.
# Writes the S3 identity (from DAY0_S3_ACCESS_KEY/DAY0_S3_SECRET_KEY) and the filer's webhook to
# the release receiver (DAY0_SEAWEEDFS_WEBHOOK_URL with DAY0_SEAWEEDFS_TOKEN) next to the data,
# then runs `weed server`. Works in chrislusf/seaweedfs and in deploy/images/seaweedfs.
set -eu
: "${DAY0_S3_ACCESS_KEY:?set DAY0_S3_ACCESS_KEY}" "${DAY0_S3_SECRET_KEY:?set DAY0_S3_SECRET_KEY}"
conf=/data/conf
mkdir -p /data/store "$conf"
umask 077
cat > "$conf/s3.json" <<JSON
{"identities": [{"name": "day0",
                 "credentials": [{"accessKey": "${DAY0_S3_ACCESS_KEY}", "secretKey": "${DAY0_S3_SECRET_KEY}"}],
                 "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}
JSON
if [ -n "${DAY0_SEAWEEDFS_WEBHOOK_URL:-}" ]; then
  {
    echo "[notification.webhook]"
    echo "enabled = true"
    echo "endpoint = \"${DAY0_SEAWEEDFS_WEBHOOK_URL}\""
    [ -n "${DAY0_SEAWEEDFS_TOKEN:-}" ] && echo "bearer_token = \"${DAY0_SEAWEEDFS_TOKEN}\""
    echo "timeout_seconds = 10"
    echo "max_retries = 10"
    echo "backoff_seconds = 2"
    echo "max_backoff_seconds = 30"
    echo "workers = 2"
  } > "$conf/notification.toml"
else
  rm -f "$conf/notification.toml"
fi
# DAY0_S3_BUCKETS: buckets created once the cluster answers (existing ones are kept)
if [ -n "${DAY0_S3_BUCKETS:-}" ]; then
  (
    for _ in $(seq 1 120); do
      if echo "s3.bucket.list" | weed shell -master=127.0.0.1:9333 >/dev/null 2>&1; then
        existing=$(echo "s3.bucket.list" | weed shell -master=127.0.0.1:9333 2>/dev/null)
        for b in $(echo "$DAY0_S3_BUCKETS" | tr ',' ' '); do
          echo "$existing" | grep -q "^ *$b\b" || echo "s3.bucket.create -name $b" | weed shell -master=127.0.0.1:9333 >/dev/null 2>&1 \
            && echo "start.sh: bucket $b ready"
        done
        exit 0
      fi
      sleep 1
    done
    echo "start.sh: could not create buckets $DAY0_S3_BUCKETS" >&2
  ) &
fi
cd "$conf"   # the filer reads ./notification.toml
exec weed server -dir=/data/store -ip=127.0.0.1 -ip.bind=0.0.0.0 \
  -master.port=9333 -volume.port=8080 -filer -filer.port=8888 \
  -s3 -s3.port=8333 -s3.config="$conf/s3.json" -s3.port.iceberg=0 -s3.port.lance=0 \
  -master.telemetry=false -master.volumeSizeLimitMB=1024 -volume.max=100 \
  -volume.preStopSeconds=1 "$@"
