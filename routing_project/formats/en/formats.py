"""Dates and times as the admin shows them: to the second, on a 24-hour clock. Django's own
English format ("Dec. 7, 2026, 3:30 a.m.") cut them to the minute: an assignment started, due,
accepted and escalated within one minute read as the same moment on a lead's page. With the
time zone's name ("UTC"): reps' working hours and absences are in their own zones, and a
manager reading a due time must know which clock it is on."""

DATETIME_FORMAT = "N j, Y, H:i:s T"
TIME_FORMAT = "H:i:s"
SHORT_DATETIME_FORMAT = "Y-m-d H:i:s T"
