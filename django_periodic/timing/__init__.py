"""Time maths, without the database: triggers and cron fields, DST, stagger, calendars
(closed days and blackouts, the fires they leave open), and the range of stored times."""
