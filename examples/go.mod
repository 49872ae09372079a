module github.com/ratecord/ratecord/examples

go 1.25

replace github.com/ratecord/ratecord => ../

require (
	github.com/bwmarrin/discordgo v0.29.0
	github.com/ratecord/ratecord v0.0.0-00010101000000-000000000000
)

require (
	github.com/cenkalti/backoff/v4 v4.3.0 // indirect
	github.com/gorilla/websocket v1.4.2 // indirect
	golang.org/x/crypto v0.0.0-20210421170649-83a5a9bb288b // indirect
	golang.org/x/sys v0.0.0-20201119102817-f84b799fce68 // indirect
)
