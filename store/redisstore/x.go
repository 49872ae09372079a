package redisstore

import "github.com/redis/go-redis/v9"

var _ redis.UniversalClient = (*redis.Client)(nil)
