module github.com/ratecord/ratecord

go 1.25

require (
	github.com/cenkalti/backoff/v4 v4.3.0
	github.com/jarcoal/httpmock v1.4.2
	go.uber.org/goleak v1.3.0
)
