package gateway

// NoticeHold is noticeHold, for the external tests.
const NoticeHold = noticeHold
