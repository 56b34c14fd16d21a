from django.contrib import admin
from django.urls import path

from . import views
from .invoices import views as invoices

urlpatterns = [
    path("", views.index, name="index"),
    path("hold/<slug:name>/", views.hold, name="hold"),
    path("ahold/<slug:name>/", views.ahold, name="ahold"),
    path("invoices/<int:pk>/pay/", invoices.pay, name="pay"),
    path("invoices/<int:pk>/apay/", invoices.apay, name="apay"),
    path("invoices/reset/", invoices.reset, name="reset-invoices"),
    path("admin/", admin.site.urls),
]
