module github.com/keyorder/keyorder

go 1.26
