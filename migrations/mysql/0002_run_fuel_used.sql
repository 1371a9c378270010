-- Fuel a successful run consumed, as reported by its executor (null when unknown).
alter table runs add column fuel_used bigint;
