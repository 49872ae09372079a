package redisstore

// ModelSource is the model the scripts share, for the transition tests.
var ModelSource = modelSource
